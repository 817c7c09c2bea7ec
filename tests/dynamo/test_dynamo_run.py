"""The issue's acceptance command: ``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/agg.sh --runtime
dynamo --run CMD`` prints "Hello world!" from the real Dynamo frontend, then stops everything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest
from dynamo_helpers import HELLO, PYTHON, ROOT, free_port_block

pytestmark = pytest.mark.engine


def test_run_prints_hello_world_from_the_dynamo_frontend_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.process_iter()}
    # The answer goes to a file of its own: on stdout it shares the pipe with the children's
    # prefixed log lines, and a log line longer than a pipe write can be split around it.
    answer = tmp_path / "answer.txt"
    client = f'{PYTHON} examples/openai_client.py --hello --base-url "$OPENAI_BASE_URL" > {answer}'
    out = subprocess.run([str(ROOT / "launch" / "agg.sh"), "--runtime", "dynamo", "--port", str(free_port_block(2)),
                          "--run", client], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "1", "DYN_READY_TIMEOUT": "900",
                              "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert answer.read_text().splitlines() == [HELLO], out.stdout[-3000:]
    assert "NVIDIA Dynamo frontend, 1 vLLM worker(s)" in out.stderr
    assert list(tmp_path.glob("dynlogits-dynamo.*")) == []  # the private discovery folder is removed
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and any(m in " ".join(p.info["cmdline"] or []) for m in ("dynamo.frontend", "dynamo.vllm"))]
    assert left == [], left
