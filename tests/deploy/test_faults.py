"""Faults under load, on a real ``launch/agg.sh`` deployment: a worker killed, a frontend killed, SIGTERM.

The tests run in order on one deployment:

1. SIGKILL to the worker process once the 6 streaming ones of 12 requests (8 samples of 2,000
   tokens each, seconds of engine work) have their first token: every request still running ends
   with an error saying the worker was lost (502) or is unavailable (503), none hangs; new requests get 503; the launch script ends
   the engine processes the worker left behind; a worker started again on the same port is noticed
   by the frontend's readiness polling (no frontend restart) and requests succeed.
2. SIGKILL to a frontend once its 4 streams (16 samples of 2,000 tokens each) have started: the
   clients get a connection error, the worker aborts exactly those 4 engine requests; a frontend started again
   on the same port serves at once, with no worker restart.
3. SIGTERM to a frontend with 8 streams open, then to the worker with 8 streams open (8 samples
   of 1,000 tokens each): every in-flight request completes in full; during the worker's drain new
   requests get 503.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

from .conftest import SPEC_FILE
from .launcher import LOG_DIR, PYTHON, ROOT, Deployment, free_port_block, settled_stats, wait_until

pytestmark = pytest.mark.engine

MODEL = "dynlogits-tiny"
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"}


@dataclass
class Outcome:
    stream: bool
    text: str = ""
    finish: str | None = None
    completion_tokens: int = 0
    error: str | None = None
    seconds: float = 0.0
    ended_at: float = 0.0  # time.monotonic()


class Background:
    """``n`` requests sent at once from a thread with the real ``openai`` client (half streaming);
    ``outcomes(timeout)`` joins and fails the test if any request has not ended by then.

    The engine runs far ahead of the HTTP layers on this tiny model (a worker finishes a 2,000-token
    stream long before its client has read it), so requests meant to be in flight on the *engine*
    when a process dies ask for ``choices`` samples of ``max_tokens`` each and the tests wait for the
    worker's own ``in_flight`` count."""

    def __init__(self, base_url: str, n: int, *, max_tokens: int, forced: bool = False,
                 stream_all: bool = False, choices: int = 1) -> None:
        self.base_url, self.n, self.max_tokens, self.forced, self.stream_all = base_url, n, max_tokens, forced, stream_all
        self.choices = choices
        self.results: list[Outcome] = []
        self.streaming = 0  # streams that have received their first chunk
        self.crash: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as err:  # noqa: BLE001 - reported by the test's waits
            self.crash = err

    def __repr__(self) -> str:
        return f"Background(streaming={self.streaming}, crash={self.crash!r}, results={self.results})"

    async def _one(self, client: Any, i: int) -> Outcome:
        out = Outcome(stream=self.stream_all or i % 2 == 0)
        kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": f"Request {i}."}],
                                  "max_tokens": self.max_tokens, "n": self.choices}
        if self.forced:
            kwargs["extra_body"] = {"logits_processors": [{"kind": "forced_text", "text": f"answer {i}"}]}
        else:
            kwargs["extra_body"] = {"ignore_eos": True}
        started = time.monotonic()
        try:
            if out.stream:
                stream = await client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                              **kwargs)
                async for chunk in stream:
                    self.streaming += not out.text and chunk.choices and bool(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        out.completion_tokens = chunk.usage.completion_tokens
                    for c in chunk.choices:
                        out.text += c.delta.content or ""
                        out.finish = c.finish_reason or out.finish
            else:
                reply = await client.chat.completions.create(**kwargs)
                out.text = "".join(c.message.content or "" for c in reply.choices)
                out.finish = reply.choices[-1].finish_reason
                out.completion_tokens = reply.usage.completion_tokens if reply.usage else 0
        except Exception as err:  # noqa: BLE001 - the outcome under test
            status = getattr(err, "status_code", None)
            out.error = f"{type(err).__name__}({status}): {getattr(err, 'message', None) or err}"
        out.ended_at = time.monotonic()
        out.seconds = out.ended_at - started
        return out

    async def _run(self) -> None:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=300) as client:
            self.results = list(await asyncio.gather(*(self._one(client, i) for i in range(self.n))))

    def outcomes(self, timeout: float) -> list[Outcome]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"requests still pending {timeout} s later: a hang"
        return self.results


def _stats(worker_url: str) -> dict[str, Any]:
    return httpx.get(f"{worker_url}/stats", timeout=30).json()


def _wait_streaming(load: Background, streams: int) -> None:
    """Until ``streams`` of ``load``'s streams have their first token. The engine is then still far
    from done (seconds of work queued), which each test checks afterwards from the worker's counters
    or the clients' end times; polling ``/stats`` instead is unreliable while the worker is
    saturated (its answers then lag by seconds)."""
    wait_until(lambda: load.streaming >= streams or not load.thread.is_alive(), 120, f"{streams} streams to start")
    assert load.streaming >= streams and load.crash is None, load


def _health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / f"{name}.log", "ab") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group, then SIGKILL whatever of the group is left (e.g. a resource tracker)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Faults:
    """The deployment and the processes the tests start in place of the ones they kill."""

    d: Deployment
    worker_cmd: list[str]
    started: dict[str, subprocess.Popen[bytes]]

    @property
    def worker_url(self) -> str:
        return self.d.worker_url(1)


def _second_frontend(faults: Faults) -> str:
    """URL of a second frontend on the deployment's worker, started (or restarted, on the port it
    had) unless one is running: each test that uses it stands alone even if the one before it
    failed with that frontend killed."""
    proc = faults.started.get("frontend")
    port = free_port_block(1) if proc is None else int(proc.args[proc.args.index("--port") + 1])  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    if proc is None or proc.poll() is not None:
        cmd = [PYTHON, "-m", "dynlogits.frontend", "--port", str(port), "--agg-worker", faults.worker_url,
               "--logits-spec", str(SPEC_FILE)]
        faults.started["frontend"] = _start("faults-frontend", cmd)
        wait_until(lambda: _health(url) == 200, 60, "the second frontend")
    return url


@pytest.fixture(scope="module")
def faults() -> Iterator[Faults]:
    d = Deployment("faults", "agg.sh", free_port_block(2),
                   args=["--logits-spec", str(SPEC_FILE), "--max-model-len", "2048", "--graceful-timeout", "60"],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    worker = next(p for p in d.processes() if "dynlogits.worker" in " ".join(p.cmdline()))
    f = Faults(d, worker.cmdline(), {})
    try:
        yield f
    finally:
        for proc in f.started.values():
            _end(proc)
        d.stop()


def test_a_killed_worker_fails_in_flight_requests_clearly_and_a_restarted_one_is_picked_up(faults: Faults) -> None:
    d = faults.d
    frontend = next(p for p in d.processes() if "dynlogits.frontend" in " ".join(p.cmdline()))
    load = Background(d.base_url, 12, max_tokens=2000, choices=8)
    _wait_streaming(load, 6)
    worker = next(p for p in d.processes() if "dynlogits.worker" in " ".join(p.cmdline()))
    engine = [p for p in worker.children(recursive=True)]
    assert any("VLLM::EngineCore" in " ".join(p.cmdline()) for p in engine)
    worker.send_signal(signal.SIGKILL)  # the worker process alone, as the OOM killer would

    outcomes = load.outcomes(timeout=60)
    failed = [o for o in outcomes if o.error]
    assert len(failed) >= 6, outcomes
    for o in failed:
        assert ("(502)" in o.error and "worker's connection was lost" in o.error) or (
            "(503)" in o.error and "worker" in o.error) or (
            o.stream and "APIError" in o.error and "worker's connection was lost" in o.error), o
    assert all(o.finish == "length" and o.completion_tokens == 16000 for o in outcomes if not o.error)

    r = httpx.post(f"{d.base_url}/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}], "max_tokens": 2})
    assert r.status_code == 503 and "worker" in r.json()["error"]["message"], r.text
    assert _health(d.url) == 503
    assert httpx.get(f"{d.base_url}/models", timeout=5).json()["data"] == []
    # The launch script ends what the worker left behind (vLLM's engine does not watch its parent).
    psutil.wait_procs(engine, timeout=15)
    assert not [p for p in engine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    faults.started["worker"] = _start("faults-worker-restarted", faults.worker_cmd)
    wait_until(lambda: _health(d.url) == 200, 300, "the frontend to notice the restarted worker")
    assert frontend.is_running()  # the same frontend process throughout
    outcomes = Background(d.base_url, 16, max_tokens=16, forced=True).outcomes(timeout=120)
    assert [o.text for o in outcomes] == [f"answer {i}" for i in range(16)], outcomes


def test_a_killed_frontend_leaves_the_worker_serving(faults: Faults) -> None:
    url = _second_frontend(faults)
    worker_pid = _stats(faults.worker_url)["pid"]
    before = _stats(faults.worker_url)

    load = Background(f"{url}/v1", 4, max_tokens=2000, choices=16, stream_all=True)
    _wait_streaming(load, 4)
    faults.started["frontend"].send_signal(signal.SIGKILL)
    outcomes = load.outcomes(timeout=60)
    assert all(o.error and "APIConnectionError" in o.error for o in outcomes), outcomes
    stats = settled_stats(faults.worker_url, 60)  # the worker aborts the orphaned requests
    assert stats["aborted"] - before["aborted"] == 4 and stats["in_flight"] == 0, stats
    assert stats["adapter_requests"] == 0, stats  # 4 x 16 rows held a moment after the aborts

    assert _second_frontend(faults) == url  # restarted on the same port
    outcomes = Background(f"{url}/v1", 8, max_tokens=16, forced=True).outcomes(timeout=120)
    assert [o.text for o in outcomes] == [f"answer {i}" for i in range(8)], outcomes
    assert _stats(faults.worker_url)["pid"] == worker_pid  # the worker was never restarted


def test_sigterm_to_a_frontend_drains_its_in_flight_requests(faults: Faults) -> None:
    url = _second_frontend(faults)
    proc = faults.started["frontend"]
    load = Background(f"{url}/v1", 8, max_tokens=400, stream_all=True)
    _wait_streaming(load, 8)
    proc.send_signal(signal.SIGTERM)
    outcomes = load.outcomes(timeout=60)
    assert all(o.error is None and o.finish == "length" and o.completion_tokens == 400 for o in outcomes), outcomes
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_sigterm_to_the_worker_drains_its_in_flight_requests_and_refuses_new_ones(faults: Faults) -> None:
    d, worker = faults.d, faults.started["worker"]
    load = Background(d.base_url, 8, max_tokens=1000, choices=8, stream_all=True)
    _wait_streaming(load, 8)
    sent_sigterm = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    r = httpx.post(f"{d.base_url}/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "late"}], "max_tokens": 2})
    assert r.status_code == 503, r.text
    outcomes = load.outcomes(timeout=120)
    assert all(o.error is None and o.finish == "length" and o.completion_tokens == 8000 for o in outcomes), outcomes
    assert all(o.ended_at > sent_sigterm for o in outcomes)  # every one was still streaming at SIGTERM
    assert worker.wait(timeout=120) == -signal.SIGTERM
    log = (LOG_DIR / "faults-worker-restarted.log").read_text()
    assert "worker stopped: in-flight requests drained, engine shut down" in log
