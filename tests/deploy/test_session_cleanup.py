"""A test session, or a launch script, killed by a signal leaves none of its deployment processes behind.

An inner pytest session (with this suite's session clean-up, ``tests/session_reaper.py``) starts
``launch/agg.sh`` the way the deployment fixtures do, in a session of its own, and is then
killed with SIGKILL (no teardown can run) or SIGTERM (Python's default: exit at once, no teardown
either). Every process of that deployment must be gone shortly after. A launch script whose
process group is SIGKILLed (no trap runs) must not leave its children either.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest
from session_reaper import MARKER_ENV

from .launcher import PYTHON, ROOT, command_line, free_port_block, wait_until

INNER_CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
from session_reaper import pytest_configure, pytest_unconfigure  # noqa: F401
"""

INNER_TEST = """
import os, subprocess, time

def test_starts_a_deployment_then_waits():
    with open({log!r}, "wb") as log:
        proc = subprocess.Popen([{script!r}, "--port", "{port}"], stdout=log, stderr=subprocess.STDOUT,
                                env={{**os.environ, "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"}},
                                start_new_session=True)
    with open({pidfile!r}, "w") as f:
        f.write(str(proc.pid))
    time.sleep(600)
"""


def _inner_session_processes() -> list[psutil.Process]:
    """Processes started under the inner session: their marker extends this session's."""
    prefix = os.environ[MARKER_ENV] + ":"
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER_ENV, "").startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _frontend_up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_session_leaves_no_deployment_process(tmp_path: Path, sig: int) -> None:
    port = free_port_block(2)
    pidfile = tmp_path / "script.pid"
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST.format(tests=str(ROOT / "tests")))
    (tmp_path / "test_inner.py").write_text(INNER_TEST.format(
        script=str(ROOT / "launch" / "agg.sh"), port=port, pidfile=str(pidfile), log=str(tmp_path / "agg.log")))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    inner = subprocess.Popen([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
                              str(tmp_path / "test_inner.py")], cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: pidfile.exists() and pidfile.read_text() and _frontend_up(port), 60,
                   "the inner session's deployment")
        script = psutil.Process(int(pidfile.read_text()))
        tree = [script, *script.children(recursive=True)]
        names = " ".join(command_line(p) for p in tree)
        assert "dynlogits.serve.frontend" in names and "dynlogits.serve.worker" in names, names
        assert len(_inner_session_processes()) >= len(tree)
        inner.send_signal(sig)
        assert inner.wait(timeout=30) == -sig
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        wait_until(lambda: not _inner_session_processes(), 30, "every process of the inner session to end")
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()


def test_a_launch_script_killed_with_sigkill_leaves_no_child(tmp_path: Path) -> None:
    """SIGKILL to the script's whole process group (no trap can run): its watchdog, in a session of
    its own, ends every child group."""
    port = free_port_block(2)
    with open(tmp_path / "agg.log", "wb") as log:
        script = subprocess.Popen([str(ROOT / "launch" / "agg.sh"), "--port", str(port)], cwd=ROOT, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    try:
        wait_until(lambda: _frontend_up(port), 60, "the deployment's frontend")
        children = psutil.Process(script.pid).children(recursive=True)
        assert any("dynlogits.serve.worker" in command_line(p) for p in children)
        os.killpg(script.pid, signal.SIGKILL)
        script.wait()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait()
