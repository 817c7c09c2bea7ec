"""The frontend's client guard: the limits a handler holds each request to (:class:`ClientGuard`), and
the ASGI middleware that applies those the app cannot (:class:`ClientGuardMiddleware`). Request heads
and connections are bounded below both, in the protocol (``dynlogits.serve.http.connections``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dynlogits.serve.http.bearer_auth import send_unauthorized
from dynlogits.serve.http.connections import ABORT_KEY
from dynlogits.serve.http.protocol_errors import ProtocolErrorLog
from dynlogits.serve.limits import RequestLimits

from .args import ServerLimits
from .fair_queue import FairQueue, Ticket
from .identity import ClientIdentity
from .metrics import FrontendMetrics
from .pacing import CostPacer

__all__ = ["ClientGuard", "ClientGuardMiddleware", "guard_of", "hold_ticket"]

log = logging.getLogger("dynlogits.serve.frontend")

_GUARD = "dynlogits.client_guard"
_TICKET = "dynlogits.queue_ticket"


@dataclass
class ClientGuard:
    """Everything a handler needs to hold a request to the client limits."""

    request_limits: RequestLimits = field(default_factory=RequestLimits)
    server: ServerLimits = field(default_factory=ServerLimits)
    metrics: FrontendMetrics | None = None
    #: Who a client is; by default its address, or ``server.client_id_header`` when set.
    identity: ClientIdentity = None  # type: ignore[assignment]  # None: __post_init__ builds it from server
    #: Where client protocol errors are counted and logged (``None``: only counted in the metrics).
    protocol_errors: ProtocolErrorLog | None = None
    queue: FairQueue = field(init=False)
    #: Each client's CPU debt for its request bodies (``.pacing``).
    pacer: CostPacer = field(init=False)

    def __post_init__(self) -> None:
        s = self.server
        self.pacer = CostPacer(rate_ms_per_s=s.client_cpu_ms_per_s, burst_ms=s.client_cpu_burst_ms)
        if self.identity is None:
            self.identity = ClientIdentity(client_id_header=s.client_id_header)
        self.queue = FairQueue(max_inflight=s.max_inflight_sequences, max_per_client=s.max_client_sequences,
                               queue_timeout_s=s.queue_timeout_s)

    def client(self, scope: Scope) -> str:
        return self.identity.client(scope)

    def protocol_error(self, kind: str, detail: str) -> None:
        if self.protocol_errors is not None:
            self.protocol_errors.report(kind, detail)
        elif self.metrics is not None:
            self.metrics.protocol_errors.labels(kind=kind).inc()

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused.labels(reason=reason).inc()

    def closed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason=reason).inc()

    def update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.inflight_sequences.set(self.queue.in_flight)
            self.metrics.queued_requests.set(self.queue.queued)


def guard_of(request: Request) -> ClientGuard:
    """The guard :class:`ClientGuardMiddleware` put in the request's scope; without the middleware
    (an app served some other way) one with the default limits, shared by the app's requests, whose
    queue is not enforced (see :func:`hold_ticket`)."""
    guard = request.scope.get("state", {}).get(_GUARD)
    if guard is None:
        guard = getattr(request.app.state, "client_guard", None)
        if guard is None:
            guard = request.app.state.client_guard = ClientGuard()
    return guard


def hold_ticket(request: Request, ticket: Ticket) -> None:
    """Have the middleware release ``ticket`` once the request's response has ended. Without the
    middleware nothing would, so the ticket is released at once (the queue is then not enforced)."""
    state = request.scope.setdefault("state", {})
    if _GUARD in state:
        state[_TICKET] = ticket
    else:
        ticket.release()


class ClientGuardMiddleware:
    """Pure ASGI middleware around the frontend app: a ``/v1/`` request without a valid API key (when
    keys are set) is a 401; the guard goes into each request's scope (:func:`guard_of`); a response
    whose client takes no data for ``send_timeout_s`` is ended and its connection dropped; a 408
    closes its connection; a request's ticket is released once its response has ended, however."""

    def __init__(self, app: ASGIApp, guard: ClientGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        identity = self.guard.identity
        if identity.keys_required and scope.get("path", "").startswith("/v1/") and identity.key_of(scope) is None:
            self.guard.refused("unauthorized")
            await send_unauthorized(send, "a valid API key is required: send it as 'Authorization: Bearer <key>' "
                                          "(the openai client's api_key)")
            return
        state = scope.setdefault("state", {})
        state[_GUARD] = self.guard
        timeout = self.guard.server.send_timeout_s
        stalled = False

        async def guarded_send(message: Message) -> None:
            nonlocal stalled
            if message["type"] == "http.response.start" and message.get("status") == 408:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            try:
                with anyio.fail_after(timeout):
                    await send(message)
            except TimeoutError:
                stalled = True
                raise

        try:
            await self.app(scope, receive, guarded_send)
        except BaseException:  # noqa: BLE001 - a stall may arrive wrapped in an exception group
            if not stalled:
                raise
            log.warning("a client took no data for %g s; its response was ended and its connection dropped "
                        "(limit send_timeout)", timeout)
            self.guard.closed("send_timeout")
            abort = state.get(ABORT_KEY)
            if abort is not None:  # else uvicorn closes it, once the client has read what is buffered
                abort()
        finally:
            ticket = state.pop(_TICKET, None)
            if ticket is not None:
                ticket.release()
            self.guard.update_gauges()
