"""What the worker's handlers share: the engine and request policy once started, the counters, the
streams in flight (so SIGTERM's drain deadline can end them)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynlogits.policy.config import DeploymentConfig
from dynlogits.policy.hook import test_hook_enabled
from dynlogits.policy.request import RequestPolicy
from dynlogits.policy.roles import is_generation_stage
from dynlogits.serve.http.protocol_errors import ProtocolErrorLog

from ..protocol import WorkerInfo, WorkerStats
from .args import WorkerArgs
from .worker_engine import WorkerEngine

__all__ = ["InFlightStream", "WorkerState"]

log = logging.getLogger("dynlogits.serve.worker")


class InFlightStream(Protocol):
    """A response streaming an engine request (``engine_stream.EngineStream``), as the drain deadline sees it."""

    def end(self, reason: str) -> None:
        """End the request now with ``reason`` sent in-band, aborting its engine request."""


@dataclass
class WorkerState:
    """Everything the handlers share; ``engine``/``policy`` are set once the engine is up."""

    args: WorkerArgs
    config: DeploymentConfig
    engine: WorkerEngine[Any] | None = None
    policy: RequestPolicy | None = None
    start_error: str | None = None
    stats: WorkerStats = field(default_factory=WorkerStats)
    ids: itertools.count = field(default_factory=itertools.count)
    #: Called when the engine cannot start, or dies: the worker then exits.
    on_fatal: Callable[[], object] | None = None
    #: Set on SIGTERM: in-flight requests finish, new ones get 503 so the frontend routes elsewhere.
    draining: bool = False
    #: The streams in flight, so the drain deadline can end the ones still running.
    streams: set[InFlightStream] = field(default_factory=set)
    #: Where requests are admitted (parsed, their text resolved, their entries checked for
    #: contradictions): one thread, off the event loop, so a costly payload delays admissions only.
    admission: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="dynlogits-admission"))
    #: Client protocol errors on this worker's port: counted (in ``/stats``), logged at most once a minute per kind.
    protocol_errors: ProtocolErrorLog = field(default_factory=lambda: ProtocolErrorLog(log))

    def enter(self, sequences: int) -> None:
        """A request of ``sequences`` is in flight (until :meth:`leave`)."""
        self.stats.in_flight += 1
        self.stats.in_flight_sequences += sequences

    def leave(self, sequences: int) -> None:
        self.stats.in_flight -= 1
        self.stats.in_flight_sequences -= sequences

    @property
    def engine_dead(self) -> str | None:
        """Why the engine died, or ``None`` while it lives (or has not started)."""
        return self.stats.engine_dead

    def drain(self, deadline_s: float) -> None:
        """SIGTERM: refuse new requests now; streams still running after ``deadline_s`` are ended
        with an in-band error and their engine requests aborted (call on the event loop)."""
        self.draining = True
        asyncio.get_running_loop().call_later(deadline_s, self._end_streams, deadline_s)

    def _end_streams(self, deadline_s: float) -> None:
        if self.streams:
            log.warning("drain deadline (%g s) passed: ending %d request(s) still in flight", deadline_s,
                        len(self.streams))
        for stream in list(self.streams):
            stream.end(f"the worker is shutting down and its drain deadline ({deadline_s:g} s) passed before this "
                       "request finished; it was aborted, retry it")

    @property
    def register_adapter(self) -> bool:
        """Adapter only where the role generates and some spec source is active."""
        return is_generation_stage(self.args.disaggregation_mode) and (self.config.active or test_hook_enabled())

    def info(self) -> WorkerInfo:
        assert self.engine is not None and self.policy is not None
        deployment = self.policy.deployment
        return WorkerInfo(
            model=self.engine.model_name, role=self.args.disaggregation_mode.value, backend=self.args.backend,
            max_model_len=self.engine.max_model_len, vocab_size=self.engine.vocab_size,
            deployment_kinds=[e.kind for e in deployment.entries] if deployment and self.policy.generates else [],
            allow_request_kinds=sorted(self.config.allow_request_kinds),
            adapter_registered=self.engine.adapter_registered,
        )
