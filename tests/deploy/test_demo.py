"""``make demo`` (``scripts/demo.sh``), the README's main-job command, end to end."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from .launcher import ROOT, free_port_block

pytestmark = pytest.mark.engine


def test_demo_prints_hello_world_and_leaves_nothing_running() -> None:
    # as an operator runs it: the script generates the deployment's worker secret itself
    env = {k: v for k, v in os.environ.items() if k not in ("DYN_ENABLE_TEST_LOGITS_PROCESSOR", "DYN_WORKER_SECRET")}
    port = free_port_block(2)
    result = subprocess.run([str(ROOT / "scripts" / "demo.sh"), "--port", str(port)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[demo] answer: Hello world!" in result.stdout.splitlines()
    assert "dynlogits: stopped" in result.stderr
    ours = {("--port", str(port)), ("--port", str(port + 1))}
    left = [p for p in psutil.process_iter(["cmdline"])
            if ours & set(zip(p.info["cmdline"] or (), (p.info["cmdline"] or ())[1:]))]
    assert left == [], [p.info["cmdline"] for p in left]
