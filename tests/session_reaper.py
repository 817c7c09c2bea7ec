"""Session-wide clean-up: no process a test started outlives the test session, however it ends.

Fixture teardown does not run when pytest is killed (SIGKILL, or SIGTERM, whose default action
ends the process at once), and launch scripts put every child in its own session, so nothing
else reaps them. So each session marks its processes instead of tracking them:

* ``pytest_configure`` appends a fresh token to ``$DYN_TEST_SESSION``; every process a test starts
  inherits it through the environment, however deep (launch script -> worker -> engine core), and
  whatever session or process group it moves to.
* A reaper process (this file run as a script, in its own session) waits for pytest to exit and
  then ends every process whose environment carries the token: SIGTERM, then SIGKILL after a grace.
* ``pytest_unconfigure`` (a normal end, Ctrl-C included) runs the same sweep in-process and
  reports what it found, so a test that leaks processes is named rather than hidden.

``tests/deploy/test_session_cleanup.py`` kills a pytest running a deployment with SIGKILL and
with SIGTERM and checks nothing is left.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable

import psutil

MARKER_ENV = "DYN_TEST_SESSION"
_reaper: subprocess.Popen[bytes] | None = None
_token: str | None = None


def marked(token: str, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Processes whose environment carries ``token`` in ``$DYN_TEST_SESSION`` (``exclude`` left out)."""
    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            tokens = proc.environ().get(MARKER_ENV, "").split(":")
        except (psutil.Error, OSError):
            continue
        if token in tokens:
            found.append(proc)
    return found


def sweep(token: str, exclude: Iterable[int] = (), grace_s: float = 10.0) -> list[str]:
    """End every process marked with ``token``: SIGTERM, then SIGKILL what is left after ``grace_s``.

    Returns ``"pid name"`` for each process found.
    """
    procs = marked(token, exclude)
    names = []
    for proc in procs:
        try:
            names.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return names


def pytest_configure(config: object) -> None:
    global _reaper, _token
    _token = uuid.uuid4().hex[:12]
    inherited = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = f"{inherited}:{_token}" if inherited else _token
    _reaper = subprocess.Popen([sys.executable, __file__, "--watch", str(os.getpid()), "--token", _token],
                               stdin=subprocess.DEVNULL, start_new_session=True)


def _own_helpers() -> list[int]:
    """multiprocessing's tracker processes of pytest itself (in-process engines start them): they
    end when pytest does and ignore SIGTERM, so they are not leftovers."""
    helpers = []
    for child in psutil.Process().children():
        try:
            if "multiprocessing.resource_tracker" in " ".join(child.cmdline()):
                helpers.append(child.pid)
        except psutil.Error:
            continue
    return helpers


def pytest_unconfigure(config: object) -> None:
    if _token is None:
        return
    exclude = [*([_reaper.pid] if _reaper is not None else []), *_own_helpers()]
    left = sweep(_token, exclude=exclude)
    if left:
        print(f"\nsession clean-up: ended {len(left)} process(es) that tests left running:\n  "
              + "\n  ".join(left), file=sys.stderr)
    if _reaper is not None:
        _reaper.terminate()
        _reaper.wait(timeout=30)


def _main() -> None:
    parser = argparse.ArgumentParser(description="End a test session's processes once pytest has exited.")
    parser.add_argument("--watch", type=int, required=True, help="pytest's pid")
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a normal session end: pytest swept already
    try:
        watched = psutil.Process(args.watch)
        while watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.5)
    except psutil.NoSuchProcess:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # pytest is gone: finish the sweep whatever happens
    sweep(args.token)


if __name__ == "__main__":
    _main()
