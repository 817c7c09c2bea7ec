"""The launch scripts' worker supervision (``launch/common.sh``: ``serve_until_done``), driven with
stand-in children: the real functions, sourced as ``launch/agg.sh`` sources them, with a frontend
that sleeps and workers that exit on their own. No engine starts, so the rules (backoff, giving up
after N restarts in a row, a stable worker starting a new row, ``--no-restart``) are checked in
seconds; ``tests/deploy/test_faults.py`` checks the same supervision on a real deployment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # a whole subprocess run or build: make test-fast leaves it out

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
set -euo pipefail
source "$ROOT/launch/common.sh"
install_traps
start_child frontend sleep 120
start_child worker bash -c "$WORKER"
serve_until_done http://127.0.0.1:1/v1 ""
"""


def supervise(worker: str, *, env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run the supervision loop over a stand-in frontend (``sleep``) and ``worker`` (a bash command)
    until the script exits by itself; its exit status and log."""
    proc = subprocess.run(["bash", "-c", SCRIPT], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "ROOT": str(ROOT), "WORKER": worker, **env})
    return proc.returncode, proc.stderr


def test_a_worker_that_keeps_dying_is_restarted_with_backoff_then_the_deployment_gives_up() -> None:
    status, log = supervise("exit 3", env={"DYN_WORKER_RESTARTS": "3"})
    restarts = re.findall(r"worker exited \(status 3;.*restarting it in (\d+)s \(restart (\d) of at most 3", log)
    assert restarts == [("1", "1"), ("2", "2"), ("4", "3")], log
    assert "worker exited (status 3) after 3 restarts in a row; giving up" in log, log
    assert status == 1 and log.rstrip().endswith("dynlogits: stopped"), log  # the frontend was stopped too


def test_a_worker_that_stays_up_long_enough_starts_a_new_row_of_restarts() -> None:
    # Up 3 s each time, "stable" after 1 s: never more than one restart in a row, so it never gives
    # up; the frontend stand-in's end stops the test.
    proc = subprocess.Popen(["bash", "-c", SCRIPT], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "ROOT": str(ROOT), "WORKER": "sleep 3; exit 3",
                                 "DYN_WORKER_RESTARTS": "1", "DYN_WORKER_STABLE_S": "1"})
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        for line in proc.stderr:  # bounded by the restarts counted below (each ~4 s)
            seen.append(line)
            if len([s for s in seen if "restarting it" in s]) == 3:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    log = "".join(seen)
    assert log.count("(restart 1 of at most 1 in a row)") == 3 and "giving up" not in log, log


def test_with_restarts_off_a_dead_worker_stays_down_and_the_frontend_keeps_serving() -> None:
    proc = subprocess.Popen(["bash", "-c", SCRIPT], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "ROOT": str(ROOT), "WORKER": "exit 3", "DYN_WORKER_RESTARTS": "0"})
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "restarts are off" in line:
                break
        assert proc.poll() is None  # the deployment (its frontend) still runs
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert "restarts are off" in line and "status 3" in line, line


def test_no_restart_flag_is_parsed_by_the_launch_scripts() -> None:
    out = subprocess.run(["bash", "-c", 'source "$ROOT/launch/common.sh"; usage() { :; }; '
                          'parse_common_args --no-restart --port 9; echo "restarts=$WORKER_RESTARTS port=$PORT"'],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "ROOT": str(ROOT)})
    assert out.stdout.strip() == "restarts=0 port=9", out
