"""Connection bounds for a server (the frontend, a worker), applied in uvicorn's own protocol.

:func:`guarded_protocol` returns uvicorn's HTTP protocol class (httptools, else h11) with: the head
limits of ``.heads`` checked on the bytes as they arrive (414/431, the head never buffered); a
deadline for every request head (``header_timeout_s``: 408, then closed); a cap on open connections
that closes the one waiting longest without a request in progress, or, when every connection is
serving a request, answers the newcomer 503 (``Retry-After``); client protocol errors reported
to a ``.protocol_errors.ProtocolErrorLog``. Each request's scope gets an abort (:data:`ABORT_KEY`)
that drops its connection. Rules and figures: ``docs/reliability.md`` ("Limits").
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import Scope

from .heads import HeadLimits, HeadProblem, HeadScanner, HeadTooLarge
from .protocol_errors import ProtocolErrorLog, install_uvicorn_filter

__all__ = ["ABORT_KEY", "guarded_protocol", "parser_refused"]

#: ``scope["state"][ABORT_KEY]()`` drops the request's connection at once (set for every request
#: served through :func:`guarded_protocol`'s class; used for a client that stopped reading).
ABORT_KEY = "dynlogits.abort_connection"
#: Set in a request's ``scope["state"]`` when the parser refused the rest of it (a malformed body).
_PARSER_REFUSED = "dynlogits.parser_refused"


def parser_refused(scope: Scope) -> bool:
    """Whether the protocol already answered this request's framing error (and reported it): the app
    then sees only a disconnect, which is no second error."""
    return bool(scope.get("state", {}).get(_PARSER_REFUSED))

log = logging.getLogger("dynlogits.serve.http.connections")


def error_response(status: int, message: str, code: str, *, kind: str = "invalid_request_error",
                   retry_after_s: int | None = None) -> bytes:
    """A complete ``connection: close`` answer with an OpenAI-style JSON error (``kind``: its
    ``type``; ``retry_after_s``: a ``Retry-After`` header), written by the protocol itself (before or
    instead of the app)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    retry = b"retry-after: %d\r\n" % retry_after_s if retry_after_s is not None else b""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n%s"
            b"content-length: %d\r\n\r\n" % (status, HTTPStatus(status).phrase.encode(), retry, len(body))) + body


#: ``Retry-After`` (s) of the 503 a new connection gets while every connection serves a request.
BUSY_RETRY_AFTER_S = 1
#: Refused connections (503 at the cap, 414/431) kept open at once after their answer and half-close,
#: reading and dropping what the client still sends until it closes or the head deadline passes:
#: closing with its request unread would reset the connection, which can discard the answer before
#: the client reads it. Past this many the oldest is closed at once (its answer may then be lost).
REFUSED_LINGERING_MAX = 64


def _busy_response(serving: int) -> bytes:
    return error_response(503, f"all {serving} connections are serving requests (limit max_connections); "
                               "retry later", "server_busy", kind="service_unavailable",
                          retry_after_s=BUSY_RETRY_AFTER_S)


def _timeout_response(header_timeout_s: float) -> bytes:
    return error_response(408, f"the request head was not received within {header_timeout_s:g} s "
                               "(limit header_timeout)", "request_timeout")


class _Guard:
    """Mixed in before uvicorn's protocol class (see :func:`guarded_protocol`), through one of the
    two parser-specific classes below, which say where a head is expected."""

    header_timeout_s: float
    max_connections: int
    on_close: Callable[[str], None] | None
    head_limits: HeadLimits
    protocol_errors: ProtocolErrorLog | None
    # set by uvicorn's protocol
    transport: asyncio.Transport
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    cycle: Any
    client: tuple[str, int] | None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime
        self._in_request = False
        self._head_started = False
        self._refused = False  # answered (a head over its limits, a connection over the cap); what follows is dropped
        self._scanner = HeadScanner(self.head_limits)
        self._seen_cycle: Any = None
        self._waiting_since = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout_s, self._head_timeout)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_request:
            self._head_started = True
            if self._head_timer is None:  # the next request on a kept-alive connection
                self._waiting_since = self.loop.time()
                self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)
        try:
            self._feed(data)
        except HeadTooLarge as err:
            self._refuse_head(err.problem)
            return
        if self.cycle is not None and self.cycle is not self._seen_cycle:  # a request's head is complete
            self._seen_cycle = self.cycle
            self._in_request = True
            self._cancel_head_timer()
            # the app has not run yet: give it the means to drop this connection (see ABORT_KEY)
            self.cycle.scope.setdefault("state", {})[ABORT_KEY] = self._abort

    def _feed(self, data: bytes) -> None:
        """Hand ``data`` to uvicorn's parser, a head's bytes only once the scanner has passed them
        (``HeadTooLarge`` otherwise)."""
        while data and not self.transport.is_closing():
            if self._head_expected():
                end = self._scan_head(data)
                piece, data = (data, b"") if end is None else (data[:end], data[end:])
                super().data_received(piece)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime
            else:
                piece, data = self._body_piece(data)
                super().data_received(piece)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime
                self._check_pending_head(piece)

    # parser-specific (see _HttpToolsHeads, _H11Heads)
    def _head_expected(self) -> bool:
        raise NotImplementedError

    def _scan_head(self, data: bytes) -> int | None:
        raise NotImplementedError

    def _body_piece(self, data: bytes) -> tuple[bytes, bytes]:
        return data, b""

    def _check_pending_head(self, piece: bytes) -> None:
        """After body bytes: bound a next request's head that began among them (pipelining)."""

    def _refuse_head(self, problem: HeadProblem) -> None:
        """Answer ``problem`` (414/431) and half-close; read and drop whatever else comes until the
        client closes or the head deadline passes. When an earlier request on the connection is still
        being answered (a pipelined head), the connection is dropped instead: nothing may be written
        into the middle of that answer."""
        self._refused = True
        self._report("head_too_large", problem.message)
        if self.on_close is not None:
            self.on_close("head_too_large")
        if self.cycle is not None and not self.cycle.response_complete:
            self._abort()
            return
        self._answer_and_linger(error_response(problem.status, problem.message, problem.code))

    def _answer_and_linger(self, answer: bytes) -> None:
        """Write ``answer`` and half-close; what the client sends after it is dropped (``_refused``)
        until it closes or the head deadline passes (``_head_timeout``). At most
        ``REFUSED_LINGERING_MAX`` connections linger: past it the oldest is closed now."""
        lingering = [c for c in self.connections
                     if isinstance(c, _Guard) and c is not self and c._refused and not c.transport.is_closing()]
        if len(lingering) >= REFUSED_LINGERING_MAX:
            oldest = min(lingering, key=lambda c: c._waiting_since)
            oldest._cancel_head_timer()
            oldest.transport.close()
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _report(self, kind: str, detail: str) -> None:
        if self.protocol_errors is not None:
            peer = self.client[0] if self.client else "unknown"
            self.protocol_errors.report(kind, f"{detail} (client {peer})")

    # uvicorn's hooks for client protocol errors: reported (counted, rate-limited) instead of logged
    def send_400_response(self, msg: str) -> None:
        self._report("invalid_http", msg)
        if self.cycle is not None:
            self.cycle.scope.setdefault("state", {})[_PARSER_REFUSED] = True
        super().send_400_response(msg)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime

    def _unsupported_upgrade_warning(self) -> None:
        self._report("unsupported_upgrade", "a request asked to upgrade the connection; answered as plain HTTP")

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime
        self._in_request = self.cycle is not None and not self.cycle.response_complete  # a pipelined one runs
        if not self._in_request:
            self._head_started = False
            self._waiting_since = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._refused:  # the answer went out when the head was refused
            self.transport.close()
            return
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
        """Over the cap (counting neither refused connections, whose answer is out, nor closing
        ones): close the connection waiting longest without a request in progress, else answer this
        one 503 and let it linger as refused."""
        live = [c for c in self.connections if isinstance(c, _Guard) and not c._refused and not c.transport.is_closing()]
        if len(live) <= self.max_connections:
            return
        idle = [c for c in live if c is not self and not c._in_request]
        if idle:
            victim = min(idle, key=lambda c: c._waiting_since)
            victim._close("connection_limit_shed")
        else:
            serving = len(live) - 1
            log.warning("%d connections are all serving requests (limit max_connections); refusing a new one (503)",
                        serving)
            self._refused = True
            if self.on_close is not None:
                self.on_close("connection_limit_refused")
            self._answer_and_linger(_busy_response(serving))


class _HttpToolsHeads(_Guard):
    """httptools: where a head is expected follows the parser's callbacks. A body with a
    Content-Length is handed over exactly, so the bytes after it are scanned as the next head; after
    a chunked body, a next head begun in the same read is bounded from its last blank line."""

    headers: list[tuple[bytes, bytes]]

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._in_head = True  # the parser expects (or is inside) a head
        self._body_left: int | None = None  # bytes of a Content-Length body still to come
        self._began = False  # a message began during the last body piece
        super().connection_made(transport)

    def _head_expected(self) -> bool:
        return self._in_head

    def _scan_head(self, data: bytes) -> int | None:
        return self._scanner.feed(data)

    def _body_piece(self, data: bytes) -> tuple[bytes, bytes]:
        self._began = False
        if self._body_left:
            return data[:self._body_left], data[self._body_left:]
        return data, b""

    def _check_pending_head(self, piece: bytes) -> None:
        if self._in_head and self._began:
            blank = piece.rfind(b"\r\n\r\n")
            self._scanner.reset()
            self._scanner.feed(piece[blank + 4:] if blank >= 0 else piece)

    def on_message_begin(self) -> None:
        self._began = True
        super().on_message_begin()  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime

    def on_headers_complete(self) -> None:
        self._in_head = False
        length = next((v for n, v in self.headers if n == b"content-length"), None)
        chunked = any(n == b"transfer-encoding" for n, _ in self.headers)
        self._body_left = None if chunked else int(length) if length is not None and length.strip().isdigit() else 0
        super().on_headers_complete()  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        super().on_body(body)  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime

    def on_message_complete(self) -> None:
        self._in_head, self._body_left = True, None
        super().on_message_complete()  # type: ignore[misc]  # a mixin: super() is uvicorn's protocol class at runtime


class _H11Heads(_Guard):
    """h11 buffers what it has not parsed yet: a partial head is exactly that buffer, so each read is
    scanned together with it, and after body bytes a pipelined head is the buffer left over."""

    conn: Any

    def _head_expected(self) -> bool:
        import h11

        return self.conn.their_state is h11.IDLE

    def _scan_head(self, data: bytes) -> int | None:
        buffered = self.conn.trailing_data[0]
        self._scanner.reset()
        end = self._scanner.feed(buffered + data if buffered else data)
        return None if end is None or end <= len(buffered) else end - len(buffered)

    def _check_pending_head(self, piece: bytes) -> None:
        import h11

        if self.conn.their_state is not h11.SEND_BODY:
            buffered = self.conn.trailing_data[0]
            if buffered:
                self._scanner.reset()
                self._scanner.feed(buffered)


def guarded_protocol(*, header_timeout_s: float, max_connections: int, head_limits: HeadLimits | None = None,
                     on_close: Callable[[str], None] | None = None, protocol_errors: ProtocolErrorLog | None = None,
                     http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (``http``: ``auto``, ``httptools`` or ``h11``) with the head
    limits, the head deadline and the connection cap; pass it as ``uvicorn.run(..., http=...)``.
    ``on_close(reason)`` is called for each connection closed by a rule (``head_too_large``,
    ``header_timeout``, ``connection_limit_shed``, ``connection_limit_refused``); client protocol
    errors go to ``protocol_errors`` (and uvicorn's own warning lines for them are dropped)."""
    if header_timeout_s <= 0 or max_connections < 1:
        raise ValueError("header_timeout_s must be > 0 and max_connections >= 1")
    if http == "auto":
        try:
            import httptools  # noqa: F401 - uvicorn's "auto" picks httptools when it imports
        except ImportError:
            http = "h11"
        else:
            http = "httptools"
    base: type[asyncio.Protocol]
    heads: type[_Guard]
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base, heads = H11Protocol, _H11Heads
    elif http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base, heads = HttpToolsProtocol, _HttpToolsHeads
    else:
        raise ValueError(f"http must be 'auto', 'httptools' or 'h11', got {http!r}")
    install_uvicorn_filter()
    return type(f"Guarded{base.__name__}", (heads, base),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
                 "head_limits": head_limits or HeadLimits(),
                 "on_close": staticmethod(on_close) if on_close is not None else None,
                 "protocol_errors": protocol_errors})
