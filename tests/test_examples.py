"""examples/custom_processor.py: a python-kind processor from operator config, on a real vLLM engine."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.engine
def test_custom_processor_from_config_drives_a_real_engine(embedded_tokenizer):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("DYN_LOGITS_PYTHON_FACTORIES", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_processor.py")],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = embedded_tokenizer.decode([262, 635, 301, 376] * 2).strip()
    assert expected == "tick tock tick tock"
    assert expected in result.stdout.splitlines()  # vLLM logs to stdout too; the answer is a line of its own
