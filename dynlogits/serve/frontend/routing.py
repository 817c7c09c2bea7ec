"""Worker pools: readiness probing, round-robin choice, skipping dead workers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx

from dynlogits.serve.protocol import WorkerInfo
from dynlogits.serve.secret import secret_headers

__all__ = ["NoWorkerError", "Role", "WorkerEndpoint", "WorkerError", "WorkerPool", "WorkerTimeoutError", "Router"]

log = logging.getLogger("dynlogits.serve.frontend")

Role = Literal["agg", "prefill", "decode"]

#: Consecutive probes that time out before a worker that was ready is taken out of rotation: a
#: worker busy under load may answer ``/ready`` late, a dead one refuses the connection at once.
PROBE_TIMEOUTS_TO_DOWN = 3
#: Seconds each readiness probe may take.
PROBE_TIMEOUT_S = 5.0


class NoWorkerError(Exception):
    """No worker of a role can take the request (HTTP 503)."""


class WorkerTimeoutError(Exception):
    """A worker sent nothing for the idle timeout (HTTP 504): hung, stopped, or starved."""


class WorkerError(Exception):
    """A worker answered with an error status; ``status`` and ``body`` are relayed to the client."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"worker answered {status}")
        self.status = status
        self.body = body


@dataclass
class WorkerEndpoint:
    """One worker URL and what the last probe found."""

    url: str
    role: Role
    ready: bool = False
    info: WorkerInfo | None = None
    last_error: str | None = "not probed yet"
    slow_probes: int = 0  # consecutive probes that timed out
    #: ``time.monotonic()`` of the last bytes any request's stream received from this worker.
    last_data: float = float("-inf")

    def sent_data_within(self, seconds: float) -> bool:
        """Whether some request's stream received bytes from this worker in the last ``seconds``:
        a worker streaming tokens is busy, not hung, even when its ``/ready`` answers late."""
        return time.monotonic() - self.last_data <= seconds


@dataclass
class WorkerPool:
    """The workers of one role, tried round-robin from a rotating start, ready ones first."""

    role: Role
    endpoints: list[WorkerEndpoint]
    _turn: itertools.count = field(default_factory=itertools.count)

    def candidates(self) -> list[WorkerEndpoint]:
        """Ready workers in round-robin order; ``NoWorkerError`` when none is ready."""
        ready = [e for e in self.endpoints if e.ready]
        if not ready:  # each worker's URL and state are for the operator (the detailed /health, the log)
            raise NoWorkerError(f"no {self.role} worker is available ({len(self.endpoints)} configured, none ready); "
                                "retry when a worker is back")
        start = next(self._turn) % len(ready)
        return ready[start:] + ready[:start]


class Router:
    """Pools per role plus the shared HTTP client; probes every worker's ``/ready`` in the background."""

    def __init__(self, workers: dict[Role, Sequence[str]], *, health_interval_s: float = 1.0,
                 round_timeout_s: float = 15.0, idle_timeout_s: float = 60.0, worker_secret: str | None = None) -> None:
        self.pools: dict[Role, WorkerPool] = {
            role: WorkerPool(role, [WorkerEndpoint(u, role) for u in urls]) for role, urls in workers.items() if urls
        }
        self.disaggregated = "agg" not in self.pools
        self.health_interval_s = health_interval_s
        self.round_timeout_s = round_timeout_s
        self.idle_timeout_s = idle_timeout_s
        # Idle connections are dropped after 2 s, before the worker's server (uvicorn: 5 s) closes
        # them, so a request is never sent on a connection the worker is closing at that moment.
        # The read timeout bounds every wait for the worker: its response headers (sent with the
        # first token) and each chunk after them.
        # Every call carries the deployment's worker secret (dynlogits.serve.secret).
        headers = secret_headers(worker_secret)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0, read=idle_timeout_s),
                                        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=64,
                                                            keepalive_expiry=2.0), headers=headers)
        # Every probe on a fresh connection: a kept-alive one may be closed by the worker just as a
        # probe is sent on it (uvicorn drops idle ones after 5 s, and a busy frontend's probe round
        # can come later than that), and one such RemoteProtocolError took a healthy worker out of
        # rotation for a second (50 requests got 503 in a deploy test with both cores busy).
        self._probe_client = httpx.AsyncClient(timeout=httpx.Timeout(PROBE_TIMEOUT_S),
                                               limits=httpx.Limits(max_keepalive_connections=0), headers=headers)
        self._task: asyncio.Task[None] | None = None

    @property
    def generation_pool(self) -> WorkerPool:
        """The pool whose output the client sees (agg, or decode when disaggregated)."""
        return self.pools["decode" if self.disaggregated else "agg"]

    def all_endpoints(self) -> list[WorkerEndpoint]:
        return [e for p in self.pools.values() for e in p.endpoints]

    def ready(self) -> bool:
        """Whether a request can be served now: every role has a ready worker, and they share a model."""
        return bool(self.model_names())

    def model_names(self) -> list[str]:
        """Models every role can serve right now (disaggregated: a ready prefill *and* decode worker
        of that model), so ``/v1/models`` never advertises a model whose requests would get 503."""
        served = [{e.info.model for e in p.endpoints if e.ready and e.info} for p in self.pools.values()]
        return sorted(set.intersection(*served)) if served else []

    async def probe(self, endpoint: WorkerEndpoint) -> None:
        """Update ``endpoint`` from one ``GET /ready``: a refusal or a 503 takes it out of rotation at
        once, a timeout only after ``PROBE_TIMEOUTS_TO_DOWN`` in a row during which no request's
        stream received anything from it (a saturated worker answers probes late but keeps
        streaming; a hung one sends nothing at all)."""
        try:
            r = await self._probe_client.get(f"{endpoint.url}/ready")
            if r.status_code == 200:
                endpoint.info = WorkerInfo.model_validate(r.json())
                if not endpoint.ready:
                    log.info("%s worker %s is ready", endpoint.role, endpoint.url)
                endpoint.ready, endpoint.last_error, endpoint.slow_probes = True, None, 0
                return
            error = ("refuses this frontend's worker secret (401): give the frontend and the worker the same "
                     "DYN_WORKER_SECRET" if r.status_code == 401 else f"not ready ({r.status_code}: {r.text[:200]})")
        except httpx.TimeoutException as err:
            if endpoint.ready and endpoint.sent_data_within(PROBE_TIMEOUT_S):
                endpoint.slow_probes = 0
                log.debug("%s worker %s answers /ready late but is streaming: busy, kept", endpoint.role, endpoint.url)
                return
            endpoint.slow_probes += 1
            if endpoint.ready and endpoint.slow_probes < PROBE_TIMEOUTS_TO_DOWN:
                return
            error = f"not answering ({type(err).__name__} on {endpoint.slow_probes} probes in a row)"
        except (httpx.HTTPError, ValueError) as err:
            error = f"unreachable ({type(err).__name__})"
        if endpoint.ready:
            log.warning("%s worker %s is down: %s", endpoint.role, endpoint.url, error)
        endpoint.ready, endpoint.last_error = False, error

    def take_out(self, endpoint: WorkerEndpoint, reason: str) -> None:
        """Out of rotation until its next successful readiness probe (a worker that hangs without
        dying may still accept connections, so only a probe that answers brings it back)."""
        if endpoint.ready:
            log.warning("%s worker %s taken out of rotation: %s", endpoint.role, endpoint.url, reason)
        endpoint.ready, endpoint.last_error = False, reason

    def idle_reason(self) -> str:
        return f"sent nothing for {self.idle_timeout_s:g} s"

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(e) for e in self.all_endpoints()))

    async def _probe_loop(self) -> None:
        """Probe every worker each interval, for the frontend's lifetime. A round that raises an
        unexpected error, or that has not ended after ``round_timeout_s`` (each probe has its own 5 s
        timeout, so only a stuck one gets there), is logged and the next round runs: a loop that died
        or hung would never see a worker come back."""
        while True:
            try:
                await asyncio.wait_for(self.probe_all(), self.round_timeout_s)
            except Exception:  # noqa: BLE001 - the loop must outlive any one probe (TimeoutError included)
                log.exception("worker readiness probe failed; probing again in %.1f s", self.health_interval_s)
            await asyncio.sleep(self.health_interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._probe_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.client.aclose()
        await self._probe_client.aclose()

    async def open_stream(self, pool: WorkerPool, body: dict[str, object], *,
                          path: str = "/generate") -> tuple[WorkerEndpoint, httpx.Response]:
        """POST ``path`` (``/generate``) to the first ready worker that takes it; the response is open (streaming).

        Unreachable, not-ready (503) or silent (no headers within the idle timeout) workers are
        taken out of rotation and the next is tried; :class:`WorkerTimeoutError` when the last one
        tried was silent; any other error status raises :class:`WorkerError`.
        """
        silent: WorkerEndpoint | None = None
        for endpoint in pool.candidates():
            try:
                response = await self._post(endpoint, body, path)
            except httpx.ReadTimeout:
                self.take_out(endpoint, self.idle_reason())
                silent = endpoint
                continue
            except httpx.TransportError as err:  # refused, timed out, or broken twice: try the next one
                endpoint.ready, endpoint.last_error = False, f"unreachable ({type(err).__name__})"
                log.warning("%s worker %s failed: %s %s; trying the next one", pool.role, endpoint.url,
                            type(err).__name__, err)
                continue
            if response.status_code == 200:
                return endpoint, response
            content = await response.aread()
            await response.aclose()
            if response.status_code == 503:
                endpoint.ready, endpoint.last_error = False, f"not ready (503: {content[:200]!r})"
                continue
            raise WorkerError(response.status_code, content)
        if silent is not None:
            raise WorkerTimeoutError(f"the {pool.role} worker {self.idle_reason()} (no response to this request); it is "
                                     "out of rotation until it answers again; retry the request")
        raise NoWorkerError(f"no {pool.role} worker is available (every ready one failed just now); "
                            "retry when a worker is back")

    async def _post(self, endpoint: WorkerEndpoint, body: dict[str, object], path: str = "/generate") -> httpx.Response:
        """``POST path``, streaming. A connection that breaks before the response headers (not a
        refusal or a timeout) is retried once on a fresh connection: that is a kept-alive connection
        closed under us, or a worker that just died, which the retry then finds refusing."""
        try:
            return await self.client.send(self.client.build_request("POST", f"{endpoint.url}{path}", json=body),
                                          stream=True)
        except (httpx.ConnectError, httpx.TimeoutException):
            raise
        except httpx.TransportError as err:
            log.info("%s worker %s: %s before the response; retrying once", endpoint.role, endpoint.url,
                     type(err).__name__)
        return await self.client.send(self.client.build_request("POST", f"{endpoint.url}{path}", json=body),
                                      stream=True)
