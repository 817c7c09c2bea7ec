"""The offline examples in ``examples/``, each run as a user would run it, on a real vLLM engine."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


def run_example(name: str, *args: str) -> list[str]:
    """Run ``examples/<name>`` in a fresh interpreter; its stdout lines (vLLM logs there too)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("DYN_LOGITS_PYTHON_FACTORIES", None)
    env.pop("DYN_ENABLE_TEST_LOGITS_PROCESSOR", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_custom_processor_from_config_drives_a_real_engine(embedded_tokenizer):
    lines = run_example("custom_processor.py")
    expected = embedded_tokenizer.decode([262, 635, 301, 376] * 2).strip()
    assert expected == "tick tock tick tock"
    assert expected in lines  # the answer is a line of its own among vLLM's log lines


def test_offline_example_forces_the_requested_text():
    assert "Hello world!" in run_example("offline_forced_text.py")
    assert "Forced: ünïcödé, 42 & more." in run_example("offline_forced_text.py", "--text", "Forced: ünïcödé, 42 & more.")
