"""Faults under load, on a real ``launch/agg.sh`` deployment: a worker killed, its engine killed, a
worker that hangs, a frontend killed, SIGTERM.

The tests run in order on one deployment, which supervises its worker (``launch/common.sh``):

1. SIGKILL to the worker process once the 6 streaming ones of 12 requests (8 samples of 2,000
   tokens each, seconds of engine work) have their first token: every request still running ends
   with an error saying the worker was lost (502) or is unavailable (503), none hangs; new requests
   get 503 with ``Retry-After``; the launch script ends the engine processes the worker left behind
   and starts the worker again, and the frontend's readiness polling picks it up (no frontend restart).
2. SIGKILL to the worker's engine core (a GPU fault, the OOM killer) with four streaming ``n=16``
   requests in flight: those the engine had not finished end with a clear error within 10 s, the worker says why and exits
   (status 3), the launch script restarts it, and the deployment answers again within 90 s.
3. SIGSTOP to the worker (hung, not dead) behind a frontend with a 5 s worker idle timeout: its
   in-flight requests end with 504 once the worker has sent nothing for 5 s, the worker is out of
   rotation until it answers again, and after SIGCONT the deployment serves again.
4. SIGKILL to a frontend once its 4 streams (16 samples of 2,000 tokens each) have started: the
   clients get a connection error, the worker aborts exactly those 4 engine requests; a frontend started again
   on the same port serves at once, with no worker restart.
5. SIGTERM to a frontend (drain deadline FRONTEND_DRAIN_S) with 8 streams open: every in-flight
   request completes in full.
6. SIGTERM to the worker (drain deadline DRAIN_S) with short and long streams open: new requests get
   503 at once; each in-flight request either completes in full or, still running at the deadline,
   ends with an error naming the drain deadline; the script then starts the worker again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import pytest

from .conftest import SPEC_FILE
from .launcher import LOG_DIR, PYTHON, ROOT, WORKER_AUTH, Deployment, command_line, free_port_block, settled_stats, wait_until

pytestmark = pytest.mark.engine

MODEL = "dynlogits-tiny"
DRAIN_S = 5  # the worker's drain deadline after SIGTERM (--graceful-timeout)
SHORT_TOKENS = 40  # a fiftieth of the long streams' steps: inside DRAIN_S even on a loaded machine
IDLE_S = 5  # the idle timeout of the frontend that test 3 starts
# The second frontend's drain deadline: far beyond what 8 x 400 tokens take on a loaded machine (a
# clean-clone run with a busy core needed more than the 10 s default), so the drain test checks that
# SIGTERM lets in-flight requests finish, not how fast this machine streams them.
FRONTEND_DRAIN_S = 120
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"}


@dataclass
class Outcome:
    stream: bool
    text: str = field(default="", repr=False)  # thousands of random tokens: kept out of failure messages
    finish: str | None = None
    completion_tokens: int = 0
    error: str | None = None
    seconds: float = 0.0
    ended_at: float = 0.0  # time.monotonic()
    last_chunk_at: float = 0.0  # time.monotonic() of the last chunk a stream received


class Background:
    """``n`` requests sent at once from a thread with the real ``openai`` client (half streaming);
    ``outcomes(timeout)`` joins and fails the test if any request has not ended by then.

    The engine runs far ahead of the HTTP layers on this tiny model (a worker finishes a 2,000-token
    stream long before its client has read it), so requests meant to be in flight on the *engine*
    when a process dies ask for ``choices`` samples of ``max_tokens`` each and the tests wait for the
    worker's own ``in_flight`` count."""

    def __init__(self, base_url: str, n: int, *, max_tokens: int, forced: bool = False,
                 stream_all: bool = False, choices: int = 1,
                 when_streaming: tuple[int, Callable[[], None]] | None = None) -> None:
        self.base_url, self.n, self.max_tokens, self.forced, self.stream_all = base_url, n, max_tokens, forced, stream_all
        self.choices = choices
        #: ``(k, act)``: ``act()`` is called once, on the requests' own thread, the moment ``k`` streams
        #: have their first chunk: a test acts then, not up to a poll interval later.
        self.when_streaming = when_streaming
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
                    out.last_chunk_at = time.monotonic()
                    first = not out.text and chunk.choices and bool(chunk.choices[0].delta.content)
                    self.streaming += first
                    if first and self.when_streaming is not None and self.streaming == self.when_streaming[0]:
                        self.when_streaming[1]()
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
    return httpx.get(f"{worker_url}/stats", timeout=30, headers=WORKER_AUTH).json()


def _wait_streaming(load: Background, streams: int) -> None:
    """Until ``streams`` of ``load``'s streams have their first token. The engine is then still far
    from done (seconds of work queued), which each test checks afterwards from the worker's counters
    or the clients' end times; polling ``/stats`` instead is unreliable while the worker is
    saturated (its answers then lag by seconds)."""
    wait_until(lambda: load.streaming >= streams or not load.thread.is_alive(), 120, f"{streams} streams to start")
    assert load.streaming >= streams and load.crash is None, load


def _refused_while_down(base_url: str) -> None:
    """A request now gets 503 naming the missing worker, with ``Retry-After``."""
    r = httpx.post(f"{base_url}/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "anyone?"}], "max_tokens": 2})
    assert r.status_code == 503 and "worker" in r.json()["error"]["message"], r.text
    assert int(r.headers["retry-after"]) > 0, r.headers


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
    started: dict[str, subprocess.Popen[bytes]]

    @property
    def worker_url(self) -> str:
        return self.d.worker_url(1)

    def worker(self) -> psutil.Process:
        """The worker process the launch script runs now (it starts a new one when one exits)."""
        return self.d.named("dynlogits.serve.worker")[0]

    def wait_serving(self, timeout: float, since: int) -> float:
        """Seconds until the script has restarted the worker (its log, after byte ``since``) and
        the frontend answers a request again; fails after ``timeout``."""
        started = time.monotonic()
        self.d.wait_for_log("restarting it in", since, timeout=60)
        wait_until(lambda: _health(self.d.url) == 200, timeout, "the frontend to route to the restarted worker")
        outcomes = Background(self.d.base_url, 4, max_tokens=16, forced=True).outcomes(timeout=timeout)
        assert [o.text for o in outcomes] == [f"answer {i}" for i in range(4)], outcomes
        return time.monotonic() - started


def _second_frontend(faults: Faults) -> str:
    """URL of a second frontend on the deployment's worker, started (or restarted, on the port it
    had) unless one is running: each test that uses it stands alone even if the one before it
    failed with that frontend killed."""
    proc = faults.started.get("frontend")
    port = free_port_block(1) if proc is None else int(proc.args[proc.args.index("--port") + 1])  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    if proc is None or proc.poll() is not None:
        cmd = [PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port), "--agg-worker", faults.worker_url,
               "--logits-spec", str(SPEC_FILE), "--graceful-timeout", str(FRONTEND_DRAIN_S)]
        faults.started["frontend"] = _start("faults-frontend", cmd)
        wait_until(lambda: _health(url) == 200, 60, "the second frontend")
    return url


def _idle_frontend(faults: Faults) -> str:
    """URL of a frontend on the deployment's worker with a worker idle timeout of ``IDLE_S``."""
    proc = faults.started.get("idle-frontend")
    if proc is None or proc.poll() is not None:
        port = free_port_block(1)
        cmd = [PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port), "--agg-worker", faults.worker_url,
               "--logits-spec", str(SPEC_FILE), "--worker-idle-timeout", str(IDLE_S)]
        faults.started["idle-frontend"] = proc = _start("faults-idle-frontend", cmd)
        wait_until(lambda: _health(f"http://127.0.0.1:{port}") == 200, 60, "the idle-timeout frontend")
    return f"http://127.0.0.1:{proc.args[proc.args.index('--port') + 1]}"  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def faults() -> Iterator[Faults]:
    d = Deployment("faults", "agg.sh", free_port_block(2),
                   args=["--logits-spec", str(SPEC_FILE), "--max-model-len", "2048", "--graceful-timeout", str(DRAIN_S)],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    f = Faults(d, {})
    try:
        yield f
    finally:
        for proc in f.started.values():
            _end(proc)
        d.stop()


def test_a_killed_worker_fails_in_flight_requests_clearly_and_is_restarted_and_picked_up(faults: Faults) -> None:
    d = faults.d
    frontend = d.named("dynlogits.serve.frontend")[0]
    load = Background(d.base_url, 12, max_tokens=2000, choices=8)
    _wait_streaming(load, 6)
    worker = faults.worker()
    engine = [p for p in worker.children(recursive=True)]
    assert any("VLLM::EngineCore" in command_line(p) for p in engine)
    mark = d.log_size()
    worker.send_signal(signal.SIGKILL)  # the worker process alone, as the OOM killer would

    outcomes = load.outcomes(timeout=60)
    failed = [o for o in outcomes if o.error]
    assert len(failed) >= 6, outcomes
    for o in failed:
        assert ("(502)" in o.error and "worker's connection was lost" in o.error) or (
            "(503)" in o.error and "worker" in o.error) or (
            o.stream and "APIError" in o.error and "worker's connection was lost" in o.error), o
    assert all(o.finish == "length" and o.completion_tokens == 16000 for o in outcomes if not o.error)

    _refused_while_down(d.base_url)  # the restarted worker needs far longer than this to be ready
    assert _health(d.url) == 503
    assert httpx.get(f"{d.base_url}/models", timeout=5).json()["data"] == []
    # The launch script ends what the worker left behind (vLLM's engine does not watch its parent).
    psutil.wait_procs(engine, timeout=15)
    assert not [p for p in engine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    faults.wait_serving(300, mark)  # started again by the launch script, found by the frontend's probes
    assert frontend.is_running()  # the same frontend process throughout
    outcomes = Background(d.base_url, 16, max_tokens=16, forced=True).outcomes(timeout=120)
    assert [o.text for o in outcomes] == [f"answer {i}" for i in range(16)], outcomes


def test_a_dead_engine_fails_in_flight_requests_and_the_deployment_heals_itself(faults: Faults) -> None:
    """The rule for requests in flight when the engine dies: each ends with a clear error, unless the
    engine had already generated all of it (the engine runs far ahead of the HTTP layers; one
    clean-clone run saw 4 requests of 4 x 2,000 tokens complete that way). 16 samples of 2,000
    tokens per request (128,000 tokens, about half a minute of engine work here) leave the engine
    far from done when it is killed right after the first tokens, so some must fail."""
    d = faults.d
    load = Background(d.base_url, 4, max_tokens=2000, choices=16, stream_all=True)
    _wait_streaming(load, 4)
    worker = faults.worker()
    core = next(p for p in worker.children(recursive=True) if "VLLM::EngineCore" in command_line(p))
    mark = d.log_size()
    killed = time.monotonic()
    core.send_signal(signal.SIGKILL)  # the engine alone: its worker process lives on

    outcomes = load.outcomes(timeout=60)
    failed = [o for o in outcomes if o.error]
    assert failed and all(o.finish == "length" and o.completion_tokens == 32000 for o in outcomes if not o.error), outcomes
    assert all(("EngineDeadError" in o.error or "worker's connection was lost" in o.error) for o in failed), failed
    # What the worker wrote before the death still drains to a client that reads slowly (seconds on
    # a loaded machine; see the hung-worker test): the bound runs from the later of the kill and
    # the request's last chunk, i.e. from when the client had read everything sent before the error.
    late_s = max(o.ended_at - max(killed, o.last_chunk_at) for o in failed)
    assert late_s < 10, f"an in-flight request ended {late_s:.1f} s after the engine died or its last chunk: {outcomes}"
    ended_s = max(o.ended_at for o in failed) - killed
    d.wait_for_log("engine died (EngineDeadError", mark)
    d.wait_for_log("worker exited (status 3", mark, timeout=60)

    faults.wait_serving(90 - (time.monotonic() - killed), mark)  # fails past 90 s after the kill
    print(f"in-flight requests ended {ended_s:.1f} s after the engine died; the deployment answered again "
          f"{time.monotonic() - killed:.0f} s after it")


def test_a_hung_worker_ends_its_requests_after_the_idle_timeout_and_is_routed_to_again_once_it_answers(
        faults: Faults) -> None:
    url = _idle_frontend(faults)
    # 16 samples of 2,000 tokens per request: megabytes of chunks, far more than the socket buffers
    # can hold, so the stopped worker still has most of each stream to send
    load = Background(f"{url}/v1", 4, max_tokens=2000, choices=16, stream_all=True)
    _wait_streaming(load, 4)
    worker = faults.worker()
    stopped = time.monotonic()
    worker.send_signal(signal.SIGSTOP)
    try:
        outcomes = load.outcomes(timeout=60)
        failed = [o for o in outcomes if o.error]
        assert failed and all(f"sent nothing for {IDLE_S} s" in o.error for o in failed), outcomes
        assert all(o.finish == "length" and o.completion_tokens == 32000 for o in outcomes if not o.error), outcomes
        # The idle clock starts at the last bytes the frontend reads from the worker, and what the
        # worker wrote before SIGSTOP still drains from the socket buffers for a while: as long as
        # the client reads it, which on a loaded machine is seconds (a clean-clone run with a busy
        # core saw the requests end 16.5 s after SIGSTOP). So each request must end within the idle
        # timeout of its own last chunk (which the client reads no earlier than the frontend did),
        # and none before the timeout could have passed since SIGSTOP.
        for o in failed:
            quiet_s = o.ended_at - o.last_chunk_at
            assert quiet_s < IDLE_S + 10, f"a hung-worker request ended {quiet_s:.1f} s after its last chunk"
        ended_s = min(o.ended_at for o in failed) - stopped
        # the last bytes the worker wrote before it stopped may be read just after SIGSTOP, hence - 1
        assert ended_s >= IDLE_S - 1, f"a hung-worker request ended {ended_s:.1f} s after SIGSTOP, before the timeout"
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "late"}], "max_tokens": 2})
        assert r.status_code == 503, r.text  # out of rotation: refused at once, not sent to the hung worker
    finally:
        worker.send_signal(signal.SIGCONT)
    wait_until(lambda: _health(url) == 200, 60, "the frontend to route to the worker again")
    outcomes = Background(f"{url}/v1", 4, max_tokens=16, forced=True).outcomes(timeout=120)
    assert [o.text for o in outcomes] == [f"answer {i}" for i in range(4)], outcomes
    settled_stats(faults.worker_url, 60)  # the abandoned requests are aborted once the worker runs


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
    outcomes = load.outcomes(timeout=FRONTEND_DRAIN_S + 30)
    assert all(o.error is None and o.finish == "length" and o.completion_tokens == 400 for o in outcomes), outcomes
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_sigterm_to_the_worker_drains_until_its_deadline_then_ends_what_still_runs(faults: Faults) -> None:
    """The rule, not an assumption that everything finishes in time: after SIGTERM each in-flight
    request either completes in full or, still running at the drain deadline, ends with an error
    naming it. The engine gives every sequence one token a step, so a short stream (SHORT_TOKENS)
    needs a fiftieth of the steps of a long one (2,000 tokens, 16 samples each of four requests) on any
    machine: the deadline lies between them as long as SIGTERM comes early in the long ones. So it
    goes out from the clients' own thread the moment the first short stream has its first chunk
    (the short ones start as soon as one long stream is streaming), not after a poll or after
    every stream's first chunk: behind 64 streaming sequences the client sees chunks seconds late
    (a 150-token stream polled every 0.5 s once ended before SIGTERM; waiting for every stream once
    let all four long ones finish inside a 12 s deadline)."""
    d = faults.d
    worker = faults.worker()
    long = Background(d.base_url, 4, max_tokens=2000, choices=16, stream_all=True)
    _wait_streaming(long, 1)
    mark = d.log_size()
    signalled: list[float] = []

    def sigterm() -> None:
        signalled.append(time.monotonic())
        worker.send_signal(signal.SIGTERM)

    short = Background(d.base_url, 4, max_tokens=SHORT_TOKENS, stream_all=True, when_streaming=(1, sigterm))
    wait_until(lambda: signalled or not short.thread.is_alive(), 120, "the short streams to start")
    assert signalled, short
    sent_sigterm = signalled[0]
    wait_until(lambda: _draining(faults.worker_url) in (None, True), 30, "the worker to start draining")
    _refused_while_down(d.base_url)

    short_outcomes, long_outcomes = short.outcomes(timeout=60), long.outcomes(timeout=DRAIN_S + 60)
    for o in short_outcomes + long_outcomes:
        complete = o.error is None and o.finish == "length"
        cut = o.error is not None and f"drain deadline ({DRAIN_S} s) passed" in o.error
        assert complete or cut or _not_admitted(o), o
    assert all(o.ended_at > sent_sigterm for o in long_outcomes), long_outcomes  # far from done at SIGTERM
    short_outcomes = [o for o in short_outcomes if not _not_admitted(o)]  # the first one at least: it sent SIGTERM
    assert all(o.error is None and o.completion_tokens == SHORT_TOKENS for o in short_outcomes), short_outcomes
    # The drain let requests still running at SIGTERM finish (not only those already done).
    assert any(o.ended_at > sent_sigterm for o in short_outcomes), (sent_sigterm, short_outcomes)
    cut = [o for o in long_outcomes if o.error]
    assert cut, long_outcomes
    assert all(o.ended_at - sent_sigterm >= DRAIN_S - 1 for o in cut), cut
    d.wait_for_log(f"drain deadline ({DRAIN_S} s) passed: ending", mark)
    d.wait_for_log("worker stopped: in-flight requests drained, engine shut down", mark, timeout=60)
    faults.wait_serving(300, mark)  # the launch script starts the worker again


def _not_admitted(o: Outcome) -> bool:
    """A request that reached the worker after SIGTERM (its siblings are sent together, and the
    signal goes out at the first one's first chunk): the draining worker refused it, and the
    frontend answered 503 asking to retry, before any token."""
    return (o.error is not None and o.error.startswith("InternalServerError(503)") and "retry when a worker is back" in o.error
            and o.completion_tokens == 0 and o.last_chunk_at == 0.0)


def _draining(worker_url: str) -> bool | None:
    """Whether the worker reports it is draining (``/ready`` 503 saying so); ``None`` when it no
    longer answers at all."""
    try:
        r = httpx.get(f"{worker_url}/ready", timeout=5, headers=WORKER_AUTH)
    except httpx.HTTPError:
        return None
    return r.status_code == 503 and "shutting down" in r.text
