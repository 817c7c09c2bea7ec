"""Slow and stalled clients cannot hold the frontend: request heads and bodies have deadlines, open
connections are capped (slow or idle ones shed first), and a stream whose reader stalls ends.

Real servers and sockets, no engine: a frontend process whose worker never comes up (heads and
bodies are read before any worker is chosen), and uvicorn serving a small app in a thread for what
needs a streaming response (the send deadline) or uvicorn's other HTTP implementation (h11).
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from dynlogits.frontend.admission import Admission
from dynlogits.frontend.args import ServerLimits
from dynlogits.connections import guarded_protocol
from dynlogits.frontend.limits import ClientGuard, ClientLimitsMiddleware, hold_ticket
from deploy.launcher import extra_frontend, free_port_block, wait_until

HEAD_S, BODY_S, MAX_CONNECTIONS = 1.0, 1.5, 6


def _read_all(s: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (``TimeoutError`` if it does not)."""
    s.settimeout(timeout)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _open(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


@pytest.fixture(scope="module")
def frontend() -> Iterator[int]:
    """A frontend with short deadlines and a small connection cap; its worker never comes up."""
    dead_worker = f"http://127.0.0.1:{free_port_block(1)}"
    env = {"DYN_HEADER_TIMEOUT": str(HEAD_S), "DYN_BODY_TIMEOUT": str(BODY_S),
           "DYN_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    with extra_frontend("limits", "--agg-worker", dead_worker, env=env, health=503) as url:
        yield int(url.rsplit(":", 1)[1])


def test_a_head_never_finished_gets_408_and_is_closed(frontend: int) -> None:
    s = _open(frontend)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
    started = time.monotonic()
    reply = _read_all(s, timeout=HEAD_S + 10)
    assert reply.startswith(b"HTTP/1.1 408 ") and b"limit header_timeout" in reply, reply
    assert HEAD_S - 0.2 <= time.monotonic() - started < HEAD_S + 5


def test_a_connection_that_sends_nothing_is_closed(frontend: int) -> None:
    s = _open(frontend)
    assert _read_all(s, timeout=HEAD_S + 10) == b""


def test_a_body_trickled_too_slowly_gets_408_and_the_connection_closes(frontend: int) -> None:
    s = _open(frontend)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
              b"content-length: 1000\r\n\r\n{")
    started = time.monotonic()

    def trickle() -> None:
        """A byte a quarter second, far below what the deadline needs, for the first 60% of the
        deadline only: the server cannot answer before the deadline, so no byte is ever sent after
        its close (one that was would reset the connection and discard the 408 before it is read)."""
        while time.monotonic() - started < 0.6 * BODY_S and not select.select([s], [], [], 0.25)[0]:
            if time.monotonic() - started >= 0.6 * BODY_S:  # checked again right before the send
                return
            try:
                s.send(b" ")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    reply = _read_all(s, timeout=BODY_S + 10)
    assert time.monotonic() - started >= BODY_S - 0.2  # the whole body's deadline, not an idle timer's
    head = reply.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 408 ") and b"connection: close" in head, reply
    assert b"limit body_timeout" in reply


def test_after_a_413_a_client_still_sending_is_closed_by_the_head_deadline(frontend: int) -> None:
    s = _open(frontend)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 99999999\r\n\r\n{")
    s.settimeout(10)
    assert s.recv(65536).startswith(b"HTTP/1.1 413 ")
    started = time.monotonic()
    try:
        while time.monotonic() - started < HEAD_S + 10:  # the announced body, far too slowly
            s.send(b" ")
            time.sleep(0.1)
    except OSError:  # closed under us
        pass
    assert time.monotonic() - started < HEAD_S + 5


def test_at_the_connection_cap_slow_connections_are_shed_for_a_live_client(frontend: int) -> None:
    slow = [_open(frontend) for _ in range(3 * MAX_CONNECTIONS)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\n")  # heads that will not finish in time
    started = time.monotonic()
    r = httpx.get(f"http://127.0.0.1:{frontend}/health", timeout=10)  # answers 503: no worker
    assert r.status_code == 503 and time.monotonic() - started < HEAD_S, r.text
    open_now = 0
    for s in slow:
        s.settimeout(0.05)
        try:
            open_now += s.recv(1) != b""  # a shed connection reads EOF (or a reset)
        except TimeoutError:
            open_now += 1
        except ConnectionResetError:
            pass
    assert open_now <= MAX_CONNECTIONS - 1, open_now


# --- uvicorn in a thread: h11, and the send deadline of a streaming response --------------------


class _Server:
    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.port = free_port_block(1)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", **kwargs))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "uvicorn")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"hi"})


def test_the_head_deadline_and_the_cap_hold_on_h11_too() -> None:
    protocol = guarded_protocol(header_timeout_s=HEAD_S, max_connections=2, http="h11")
    with _Server(_hello, http=protocol) as server:
        s = _open(server.port)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert _read_all(s, timeout=HEAD_S + 10).startswith(b"HTTP/1.1 408 ")
        idle = [_open(server.port) for _ in range(3)]
        assert httpx.get(f"http://127.0.0.1:{server.port}/", timeout=10).text == "hi"
        assert sum(_read_all(s, timeout=HEAD_S + 10) == b"" for s in idle) == 3


def test_a_stream_whose_reader_stalls_is_ended_and_releases_its_admission() -> None:
    """The client never reads; once the socket buffers are full the server's send blocks, and after
    ``send_timeout_s`` the response ends: the body generator is closed (what aborts the engine
    request in the frontend) and the admitted sequences are released."""
    guard = ClientGuard(server=ServerLimits(send_timeout_s=1.0))
    closed = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request

        from dynlogits.closing_stream import ClosingStreamingResponse

        request = Request(scope, receive)
        hold_ticket(request, await guard.admission.admit("c", 4))

        async def endless() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)
            finally:
                closed.set()

        await ClosingStreamingResponse(endless())(scope, receive, send)

    protocol = guarded_protocol(header_timeout_s=10, max_connections=10)
    with _Server(ClientLimitsMiddleware(app, guard), http=protocol) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed.wait(30), "the stalled stream was never ended"
        wait_until(lambda: guard.admission.in_flight == 0, 10, "the admission to be released")
        assert isinstance(guard.admission, Admission) and guard.admission.held("c") == 0
        # the connection is dropped, not left waiting for the reader to take what was buffered
        wait_until(lambda: not server.server.server_state.connections, 10, "the connection to be dropped")
