"""The deployment under load: ``--launch`` (start ``launch/agg.sh``, stop it after) and worker statistics.

Worker statistics are read only from a dynlogits frontend (its ``/health`` lists the workers, each
worker's ``/stats`` has the counters, the adapter's per-request state and the memory in use); any
other OpenAI-compatible server simply has none. Both need the deployment's worker secret
(``$DYN_WORKER_SECRET``): ``--launch`` generates one for the deployment it starts.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dynlogits.serve.secret import WORKER_SECRET_ENV, secret_headers
from dynlogits.tools.ports import free_port_block

__all__ = ["LaunchedDeployment", "find_launch_script", "worker_stats"]

#: The kinds the load mix sends; ``--launch`` allows exactly these.
LOAD_KINDS = "forced_text,banned_tokens,logit_bias"


def find_launch_script(name: str = "agg.sh") -> Path:
    """``launch/<name>`` of the source checkout this package runs from (``--launch`` needs one)."""
    script = Path(__file__).resolve().parents[3] / "launch" / name
    if not script.is_file():
        raise FileNotFoundError(f"--launch needs a source checkout: {script} not found; start a deployment "
                                "yourself and pass --base-url")
    return script


@dataclass
class LaunchedDeployment:
    """``launch/agg.sh`` started by the load tool, in its own session, logging to ``log_path``."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @classmethod
    def start(cls, extra_args: list[str], log_path: Path, ready_timeout_s: float = 600) -> LaunchedDeployment:
        """Start and wait until its frontend reports ready; progress on stderr every 10 s."""
        script = find_launch_script()
        port = free_port_block(2)  # frontend and worker of agg.sh
        os.environ.setdefault(WORKER_SECRET_ENV, secrets.token_urlsafe(32))  # worker_stats reads it too
        env = {**os.environ, "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([str(script), "--port", str(port), "--allow-request-kinds", LOAD_KINDS,
                                     *extra_args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        deployment = cls(proc, port, log_path)
        print(f"[load] started {script.name} on port {port} (log: {log_path})", file=sys.stderr, flush=True)
        started = time.monotonic()
        next_note = 10.0
        try:
            while not deployment._ready():
                if proc.poll() is not None:
                    raise RuntimeError(f"{script.name} exited with {proc.returncode} before it was ready; "
                                       f"see {log_path}")
                waited = time.monotonic() - started
                if waited > ready_timeout_s:
                    raise TimeoutError(f"{script.name} not ready after {ready_timeout_s:g} s; see {log_path}")
                if waited >= next_note:
                    print(f"[load] waiting for the deployment ({waited:.0f} s)...", file=sys.stderr, flush=True)
                    next_note += 10
                time.sleep(1)
        except BaseException:
            deployment.stop()
            raise
        print(f"[load] deployment ready after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        return deployment

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def frontend_rss(self) -> int | None:
        """Resident memory (bytes) of the launched frontend process; ``None`` without psutil."""
        try:
            import psutil
        except ImportError:
            return None
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                if "dynlogits.serve.frontend" in " ".join(p.cmdline()):
                    return int(p.memory_info().rss)
        except psutil.Error:
            return None
        return None

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM the script (it stops every child), then kill its process group if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def worker_settled(stats: dict[str, Any]) -> bool:
    """Whether one worker's ``/stats`` shows nothing in flight and no adapter per-request state
    (``adapter_requests`` is ``None`` where the worker cannot read it). The two settle apart: the
    worker counts an aborted or finished request out when it hands it back to the engine, and the
    adapter lets go of it on the engine's next step."""
    return stats.get("in_flight") == 0 and stats.get("adapter_requests") in (0, None)


def worker_stats(base_url: str) -> dict[str, dict[str, Any]]:
    """``{worker_url: its /stats}`` for every worker a dynlogits frontend lists; ``{}`` otherwise."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = secret_headers(os.environ.get(WORKER_SECRET_ENV))
    try:
        health = httpx.get(f"{root}/health", timeout=10, headers=headers).json()
        urls = [w["url"] for w in health["workers"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for url in urls:
        try:
            r = httpx.get(f"{url}/stats", timeout=10, headers=headers)
            r.raise_for_status()  # 401 without the secret
            out[url] = r.json()
        except (httpx.HTTPError, ValueError):
            continue
    return out
