"""Request heads are bounded while they arrive (``dynlogits.serve.http.heads``, ``dynlogits.serve.http.connections``):
an oversized request line gets 414, an oversized header, too many headers or an oversized head 431,
before the parser buffers the head and before the app runs; everything else is served as before,
pipelined requests included.

The scanner alone, then uvicorn in a thread with the guarded protocol (both its HTTP implementations)
and raw sockets; the frontend process itself is in ``test_frontend_client_limits.py``.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from threaded_uvicorn import ThreadedServer

from dynlogits.serve.http.connections import guarded_protocol
from dynlogits.serve.http.heads import HeadLimits, HeadScanner, HeadTooLarge
from dynlogits.serve.http.protocol_errors import ProtocolErrorLog

LIMITS = HeadLimits(max_request_line_bytes=100, max_header_bytes=200, max_headers=5, max_head_bytes=600)
HEAD_S = 5.0


# --- the scanner -----------------------------------------------------------------------------------

OVERSIZED = {  # name: (head, status, limit)
    "request line": (b"GET /" + b"a" * 100 + b" HTTP/1.1\r\n\r\n", 414, "max_request_line_bytes"),
    "header line": (b"GET / HTTP/1.1\r\nx-big: " + b"b" * 200 + b"\r\n\r\n", 431, "max_header_bytes"),
    "header count": (b"GET / HTTP/1.1\r\n" + b"".join(b"h%d: v\r\n" % i for i in range(6)) + b"\r\n", 431,
                     "max_headers"),
    "whole head": (b"GET / HTTP/1.1\r\n" + b"".join(b"h%d: %s\r\n" % (i, b"c" * 150) for i in range(4)) + b"\r\n",
                   431, "max_head_bytes"),
    "a line that never ends": (b"GET / HTTP/1.1\r\nx: " + b"d" * 10_000, 431, "max_header_bytes"),
}


@pytest.mark.parametrize(("head", "status", "limit"), OVERSIZED.values(), ids=OVERSIZED.keys())
@pytest.mark.parametrize("piece", [1, 7, 10**6], ids=["byte by byte", "7-byte reads", "one read"])
def test_the_scanner_refuses_an_oversized_head_however_it_is_split(head: bytes, status: int, limit: str,
                                                                   piece: int) -> None:
    scanner = HeadScanner(LIMITS)
    with pytest.raises(HeadTooLarge) as err:
        for i in range(0, len(head), piece):
            scanner.feed(head[i:i + piece])
    assert err.value.problem.status == status and f"(limit {limit})" in err.value.problem.message
    assert scanner.head_bytes <= LIMITS.max_head_bytes  # it stopped at the limit, not at the end


def test_the_scanner_finds_the_end_of_a_head_within_its_limits() -> None:
    head = b"\r\nPOST /v1 HTTP/1.1\r\n" + b"".join(b"h%d: %s\r\n" % (i, b"e" * 90) for i in range(5)) + b"\r\n"
    scanner = HeadScanner(LIMITS)
    assert scanner.feed(head[:50]) is None and scanner.feed(head[50:-1]) is None
    assert scanner.feed(head[-1:] + b"{body") == 1  # just past the blank line
    assert not scanner.started  # ready for the next head
    assert HeadScanner(LIMITS).feed(head + b"{body") == len(head)


def test_limits_come_from_the_environment_and_name_a_bad_variable() -> None:
    import argparse

    from dynlogits.serve.http.heads import add_head_limit_flags, head_limits_from_flags

    parser = argparse.ArgumentParser()
    add_head_limit_flags(parser, {"DYN_MAX_HEAD_BYTES": "4096"})
    assert head_limits_from_flags(parser.parse_args(["--max-headers", "7"])) == HeadLimits(max_headers=7,
                                                                                         max_head_bytes=4096)
    bad = argparse.ArgumentParser(exit_on_error=False)
    with pytest.raises(SystemExit):
        add_head_limit_flags(bad, {"DYN_MAX_HEADERS": "0"})


# --- a real server --------------------------------------------------------------------------------

class _Echo:
    """Answers ``<path> <body length>``; counts the requests that reached it."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        out = b"%s %d" % (scope["path"].encode(), size)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})


@pytest.fixture(params=["httptools", "h11"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[ThreadedServer, _Echo, ProtocolErrorLog]]:
    app, errors = _Echo(), ProtocolErrorLog(logging.getLogger("test.protocol_errors"))
    protocol = guarded_protocol(header_timeout_s=HEAD_S, max_connections=64, head_limits=LIMITS,
                                protocol_errors=errors, http=request.param)
    with ThreadedServer(app, http=protocol, ws="none") as s:
        yield s, app, errors


def _exchange(port: int, data: bytes, timeout: float = HEAD_S + 10) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def _answers(reply: bytes) -> list[tuple[int, bytes]]:
    """``(status, body)`` of each answer in ``reply`` (bodies with a Content-Length)."""
    out = []
    while reply:
        head, _, rest = reply.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        out.append((int(head[9:12]), rest[:length]))
        reply = rest[length:]
    return out


@pytest.mark.parametrize(("head", "status", "limit"), OVERSIZED.values(), ids=OVERSIZED.keys())
def test_an_oversized_head_is_answered_and_never_reaches_the_app(server: Any, head: bytes, status: int,
                                                                 limit: str) -> None:
    s, app, errors = server
    [(got, body)] = _answers(_exchange(s.port, head))
    error = json.loads(body)["error"]
    assert got == status and f"(limit {limit})" in error["message"], body
    assert error["code"] == ("uri_too_long" if status == 414 else "request_header_fields_too_large")
    assert app.calls == 0 and errors.counts["head_too_large"] == 1


def test_a_client_still_sending_a_huge_head_reads_the_answer(server: Any) -> None:
    """24 MiB of one header line: refused after the first read, the rest read and dropped, so the client
    (which finishes sending before it reads) still gets the 431."""
    s, app, _ = server
    started = time.monotonic()
    reply = _exchange(s.port, b"GET / HTTP/1.1\r\nx-huge: " + b"f" * (24 << 20) + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431 ") and app.calls == 0, reply[:200]
    assert time.monotonic() - started < HEAD_S  # closed when the client stopped, not by the deadline


def test_heads_within_the_limits_are_served_pipelined_or_not(server: Any) -> None:
    s, app, errors = server
    pipelined = (b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
                 b"POST /b HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                 b"GET /c HTTP/1.1\r\nhost: x\r\n" + b"".join(b"h%d: %s\r\n" % (i, b"g" * 90) for i in range(4))
                 + b"\r\nGET /d HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert _answers(_exchange(s.port, pipelined)) == [(200, b"/a 5"), (200, b"/b 3"), (200, b"/c 0"), (200, b"/d 0")]
    assert app.calls == 4 and not errors.counts


def test_an_oversized_head_pipelined_after_a_body_is_refused(server: Any) -> None:
    """The next request's head begins in the same read as the body before it: still bounded."""
    s, _, errors = server
    for body in (b"content-length: 2\r\n\r\nhi", b"transfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"):
        data = b"POST /a HTTP/1.1\r\nhost: x\r\n" + body + b"GET /b HTTP/1.1\r\nx-big: " + b"h" * 5000
        reply = _exchange(s.port, data)
        assert b"/b" not in reply, reply  # the second request never ran
    assert errors.counts["head_too_large"] == 2


def test_client_protocol_errors_are_counted_and_uvicorns_lines_dropped(server: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    s, _, errors = server
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            reply = _exchange(s.port, b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhi\r\n")
            assert reply.startswith(b"HTTP/1.1 400 "), reply
        _exchange(s.port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade, close\r\nupgrade: websocket\r\n\r\n")
    assert errors.counts["invalid_http"] == 5 and errors.counts["unsupported_upgrade"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert not any("Invalid HTTP request" in line and r.name.startswith("uvicorn")
                   for r, line in zip(caplog.records, lines))
    assert sum("client protocol error (invalid_http)" in line for line in lines) == 1, lines  # one per interval
