"""HTTP connections a server (the frontend, a worker) can bound: a deadline for every request head, and a cap
on open connections that sheds slow or idle ones first.

uvicorn waits for a request's head (request line and headers) as long as the client likes, so ten
clients that never finished their headers held ten connections for ever; and it accepts any number
of connections. :func:`guarded_protocol` returns uvicorn's own HTTP protocol class (httptools, or
h11 where httptools is not installed) with two rules added:

* **head deadline**: from the moment a connection opens, or the first byte of a kept-alive
  connection's next request arrives, the whole head must arrive within ``header_timeout_s``;
  otherwise the client gets 408 (nothing, if it sent nothing) and the connection is closed.
* **connection cap**: when a new connection makes more than ``max_connections``, the connection
  that has waited longest without a request in progress (a slow head, or an idle keep-alive
  connection) is closed to make room; only when every other connection is serving a request is
  the new one closed instead. A flood of slow connections therefore never locks out a live client.

Body read deadlines are the app's (``dynlogits.untrusted.read_json_body``); a reader that stalls
is ended by ``dynlogits.frontend.limits.ClientLimitsMiddleware``, which drops its connection with
the abort this protocol puts in each request's scope.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["ABORT_KEY", "guarded_protocol"]

#: ``scope["state"][ABORT_KEY]()`` drops the request's connection at once (set for every request
#: served through :func:`guarded_protocol`'s class; used for a client that stopped reading).
ABORT_KEY = "dynlogits.abort_connection"

log = logging.getLogger("dynlogits.connections")

def _timeout_response(header_timeout_s: float) -> bytes:
    body = json.dumps({"error": {"message": f"the request head was not received within {header_timeout_s:g} s "
                                            "(limit header_timeout)", "type": "invalid_request_error",
                                 "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


class _Guard:
    """Mixed in before uvicorn's protocol class (see :func:`guarded_protocol`)."""

    header_timeout_s: float
    max_connections: int
    on_close: Callable[[str], None] | None
    # set by uvicorn's protocol
    transport: asyncio.Transport
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._in_request = False
        self._head_started = False
        self._seen_cycle: Any = None
        self._waiting_since = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout_s, self._head_timeout)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        if not self._in_request:
            self._head_started = True
            if self._head_timer is None:  # the next request on a kept-alive connection
                self._waiting_since = self.loop.time()
                self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not None and self.cycle is not self._seen_cycle:  # a request's head is complete
            self._seen_cycle = self.cycle
            self._in_request = True
            self._cancel_head_timer()
            # the app has not run yet: give it the means to drop this connection (see ABORT_KEY)
            self.cycle.scope.setdefault("state", {})[ABORT_KEY] = self._abort

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._in_request = self.cycle is not None and not self.cycle.response_complete  # a pipelined one runs
        if not self._in_request:
            self._head_started = False
            self._waiting_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_request or self.transport.is_closing():
            return
        if self._head_started:
            self.transport.write(_timeout_response(self.header_timeout_s))
        self._close("header_timeout")

    def _close(self, reason: str) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.close()
            if self.on_close is not None:
                self.on_close(reason)

    def _abort(self) -> None:
        """Drop the connection now, unsent data included (``close()`` would wait for a reader that
        stalled to take it, holding the connection for as long as the client likes)."""
        self._cancel_head_timer()
        self.transport.abort()

    def _make_room(self) -> None:
        idle = [c for c in self.connections
                if isinstance(c, _Guard) and c is not self and not c._in_request and not c.transport.is_closing()]
        if idle:
            victim = min(idle, key=lambda c: c._waiting_since)
            victim._close("connection_limit_shed")
        else:
            log.warning("%d connections are all serving requests (limit max_connections); refusing a new one",
                        len(self.connections) - 1)
            self._close("connection_limit_refused")


def guarded_protocol(*, header_timeout_s: float, max_connections: int,
                     on_close: Callable[[str], None] | None = None, http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (``http``: ``auto``, ``httptools`` or ``h11``) with the head
    deadline and the connection cap; pass it as ``uvicorn.run(..., http=...)``. ``on_close(reason)``
    is called for each connection closed by a rule (``header_timeout``, ``connection_limit_shed``,
    ``connection_limit_refused``)."""
    if header_timeout_s <= 0 or max_connections < 1:
        raise ValueError("header_timeout_s must be > 0 and max_connections >= 1")
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    elif http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    return type(f"Guarded{base.__name__}", (_Guard, base),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
                 "on_close": staticmethod(on_close) if on_close is not None else None})
