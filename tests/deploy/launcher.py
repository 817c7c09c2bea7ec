"""Launching ``launch/*.sh`` deployments from tests: free ports, readiness, clean stop, leak checks."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from dynlogits.tools.load.deployment import worker_settled
from dynlogits.tools.ports import free_port_block

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
LOG_DIR = Path(os.environ.get("DYN_TEST_LOG_DIR", "/tmp/dynlogits-deploy-tests"))
#: CPU-friendly engine flags; the same the launch scripts use when no GPU is found.
#: What every launch script logs once all its processes are ready (launch/common.sh ``log``).
READY_LINE = b"dynlogits: ready: OpenAI-compatible API at "
ENGINE_FLAGS = ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512"]
#: The worker secret of every deployment and process the tests start (they inherit the environment;
#: the launch scripts use a ``DYN_WORKER_SECRET`` that is set instead of generating one).
WORKER_SECRET = os.environ.setdefault("DYN_WORKER_SECRET", secrets.token_urlsafe(32))
#: Headers of a call to a worker's routes (all but ``/health`` need the secret), or to a frontend's detailed ``/health``.
WORKER_AUTH = {"Authorization": f"Bearer {WORKER_SECRET}"}


@dataclass
class FrontendProcess:
    """A frontend process a test started (see :func:`frontend_process`)."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def log_lines(self) -> list[str]:
        assert self.log_path is not None, "started without log_path"
        return self.log_path.read_text(errors="replace").splitlines()


@contextmanager
def frontend_process(name: str, *args: str, env: dict[str, str] | None = None, health: int = 200,
                     log_path: Path | None = None) -> Iterator[FrontendProcess]:
    """A frontend process of the test's own (``args``: its flags, ``--agg-worker URL`` included) on a
    free port, its output in ``log_path`` when given; yields it once ``/health`` answers ``health``,
    and ends it afterwards."""
    port = free_port_block(1)
    out = open(log_path, "wb") if log_path is not None else None  # noqa: SIM115 - closed below
    proc = subprocess.Popen([PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port), *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT if out else None)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == health
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, f"the {name} frontend", interval=0.1)
        yield FrontendProcess(url, proc, log_path)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if out is not None:
            out.close()


@contextmanager
def extra_frontend(name: str, *args: str, env: dict[str, str] | None = None, health: int = 200) -> Iterator[str]:
    """:func:`frontend_process`, yielding its URL."""
    with frontend_process(name, *args, env=env, health=health) as frontend:
        yield frontend.url


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def settled_stats(worker_url: str, timeout: float = 30) -> dict[str, Any]:
    """The worker's ``/stats`` once it has settled (``dynlogits.tools.load.deployment.worker_settled``),
    or the last answer after ``timeout`` s (for the caller's assertion to show). A single read can
    see the adapter's rows for requests already counted out (measured: 64 rows for four aborted
    ``n=16`` streams, 0 about 0.6 s later)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{worker_url}/stats", timeout=30, headers=WORKER_AUTH).json()
        if worker_settled(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


@dataclass
class Deployment:
    """A running ``launch/<script>`` in its own session; ``stop()`` returns processes left behind."""

    name: str
    script: str
    port: int
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def worker_url(self, offset: int = 1) -> str:
        return f"http://127.0.0.1:{self.port + offset}"

    def start(self, timeout: float = 420) -> Deployment:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{self.name}.log"
        env = {**os.environ, **self.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(ROOT / "launch" / self.script), "--port", str(self.port), *self.args],
                                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def ready() -> bool:
            """The script's own verdict ("ready: ..." in its log), then the frontend's health. The
            frontend can answer before the script has seen every worker ready; a test that kills a
            worker in that window would make the script abort its start-up and stop everything."""
            assert self.proc is not None and self.log_path is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.script} exited with {self.proc.returncode}; log: {self.log_path}\n"
                                   + self.log_tail())
            if READY_LINE not in self.log_path.read_bytes():
                return False
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, timeout, f"{self.name} to be ready (log: {self.log_path})", interval=1)
        except BaseException:
            self.stop()
            raise
        return self

    def log_size(self) -> int:
        """Bytes in the deployment's log so far (a mark for ``wait_for_log``)."""
        return self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0

    def wait_for_log(self, text: str, since: int, timeout: float = 15) -> None:
        """Until ``text`` is in the log after byte ``since``. A process's line reaches the log through
        the script's prefixing pipe, so it can land after the reply the test already holds."""
        def logged() -> bool:
            assert self.log_path is not None
            with open(self.log_path, "rb") as log:
                log.seek(since)
                return text.encode() in log.read()

        wait_until(logged, timeout, f"{text!r} in {self.log_path}", interval=0.2)

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def processes(self) -> list[psutil.Process]:
        """The script and every process it started (recursively)."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def named(self, marker: str) -> list[psutil.Process]:
        """The script's processes whose command line contains ``marker`` (read with ``command_line``)."""
        return [p for p in self.processes() if marker in command_line(p)]

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> list[psutil.Process]:
        """Signal the script like an operator would; return the processes still alive after it exited."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        tree = self.processes()
        if sig == signal.SIGINT and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            # pytest runs as a background job (SIGINT ignored, and so in the script, which then
            # cannot trap it): stop it the way a supervisor would instead.
            sig = signal.SIGTERM
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # the script has waited for its children; give the last of them a bounded moment to be reaped
        others = [p for p in tree if p.pid != self.proc.pid]
        try:
            wait_until(lambda: not any(_alive(p) for p in others), 10, "the script's children to exit", interval=0.1)
        except TimeoutError:
            pass  # reported below
        left = [p for p in others if _alive(p)]
        for p in left:  # never leak into the rest of the session, even when the test fails
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return left


def command_line(p: psutil.Process) -> str:
    """``p``'s command line, space-joined; ``""`` once it has exited. A process tree read a moment
    ago can hold one that has: the launch scripts' supervisor runs ``sleep 1`` every second, a
    zombie until bash reaps it, and psutil refuses a zombie's command line (a clean-clone run with
    a busy core failed on exactly that)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
