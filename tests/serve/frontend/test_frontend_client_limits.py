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
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from deploy.launcher import FrontendProcess, free_port_block, wait_until
from deploy.launcher import frontend_process as start_frontend
from threaded_uvicorn import ThreadedServer

from dynlogits.serve.frontend.args import ServerLimits
from dynlogits.serve.frontend.client_guard import ClientGuard, ClientGuardMiddleware, hold_ticket
from dynlogits.serve.frontend.fair_queue import FairQueue
from dynlogits.serve.http.connections import guarded_protocol

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
def frontend_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontendProcess]:
    """A frontend with short deadlines and a small connection cap; its worker never comes up."""
    dead_worker = f"http://127.0.0.1:{free_port_block(1)}"
    env = {"DYN_HEADER_TIMEOUT": str(HEAD_S), "DYN_BODY_TIMEOUT": str(BODY_S),
           "DYN_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    with start_frontend("limits", "--agg-worker", dead_worker, env=env, health=503,
                        log_path=tmp_path_factory.mktemp("limits") / "frontend.log") as process:
        yield process


@pytest.fixture(scope="module")
def frontend(frontend_process: FrontendProcess) -> int:
    return frontend_process.port


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


# --- request heads and client protocol errors, on the frontend process -----------------------------


def _metric(port: int, name: str) -> float:
    """The value of one sample of the frontend's ``/metrics`` (0 when absent)."""
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _huge_head(port: int, size: int) -> bytes:
    """A head with one header line of ``size`` bytes, sent whole (as a client that writes before it
    reads would); the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-big: ")
        chunk = b"y" * (1 << 20)
        try:
            for _ in range(size >> 20):
                s.sendall(chunk)
            s.sendall(b"\r\n\r\n")
        except OSError:  # closed under us: the answer is still read
            pass
        return _read_all(s, timeout=60)


def test_oversized_heads_are_refused_and_the_frontend_keeps_no_memory(frontend_process: FrontendProcess) -> None:
    """16 heads of one 24 MiB header line (the size that grew the frontend by 337 MiB and was answered
    200 before), 4 at a time, then an oversized request line and too many headers: each refused, none
    reaches the app, the frontend's memory stays where it was and ``/health`` answers meanwhile."""
    port = frontend_process.port
    counted = 'dynlogits_client_protocol_errors_total{kind="head_too_large"}'
    before, start_rss = _metric(port, counted), frontend_process.rss()
    health_s: list[float] = []
    for _ in range(4):
        replies: list[bytes] = []
        threads = [threading.Thread(target=lambda replies=replies: replies.append(_huge_head(port, 24 << 20))) for _ in range(4)]
        for t in threads:
            t.start()
        started = time.monotonic()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 503  # no worker: 503
        health_s.append(time.monotonic() - started)
        for t in threads:
            t.join(timeout=120)
        assert len(replies) == 4 and all(r.startswith(b"HTTP/1.1 431 ") for r in replies), [r[:80] for r in replies]
        assert all(b"limit max_header_bytes" in r for r in replies)
    line = _read_all(_send(port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n"), timeout=30)
    assert line.startswith(b"HTTP/1.1 414 ") and b"limit max_request_line_bytes" in line, line[:200]
    many = _read_all(_send(port, b"GET /health HTTP/1.1\r\n" + b"x-h: 1\r\n" * 500 + b"\r\n"), timeout=30)
    assert many.startswith(b"HTTP/1.1 431 ") and b"limit max_headers" in many, many[:200]
    grown = frontend_process.rss() - start_rss
    print(f"frontend RSS {start_rss >> 20} -> {frontend_process.rss() >> 20} MiB; /health during the abuse took "
          f"{', '.join(f'{s:.3f}' for s in health_s)} s")  # noqa: T201 - figures for docs/reliability.md
    assert grown < 50 * 2**20, grown
    assert statistics.median(health_s) < 2.0, health_s
    assert _metric(port, counted) == before + 18


def _send(port: int, data: bytes) -> socket.socket:
    s = _open(port)
    s.sendall(data)
    return s


def test_malformed_chunked_bodies_add_at_most_a_few_log_lines(frontend_process: FrontendProcess) -> None:
    """200 requests whose chunked body is malformed: each is answered 400, each is counted, and the log
    gains at most a line per kind (it gained a 48-line traceback per request before)."""
    port = frontend_process.port
    counted = 'dynlogits_client_protocol_errors_total{kind="invalid_http"}'
    before, lines_before = _metric(port, counted), len(frontend_process.log_lines())
    for _ in range(200):
        reply = _read_all(_send(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: "
                                      b"application/json\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nzz\r\n"),
                          timeout=30)
        assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    wait_until(lambda: _metric(port, counted) == before + 200, 30, "the 200 errors to be counted", interval=0.1)
    added = frontend_process.log_lines()[lines_before:]
    assert len(added) <= 3 and not any("Traceback" in line for line in added), added
    assert any("client protocol error (invalid_http)" in line for line in added), added


def test_answers_carry_no_server_header(frontend: int) -> None:
    for path in ("/health", "/metrics", "/v1/models"):
        r = httpx.get(f"http://127.0.0.1:{frontend}{path}", timeout=10)
        assert "server" not in r.headers, (path, r.headers)


# --- uvicorn in a thread: h11, and the send deadline of a streaming response --------------------


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"hi"})


def test_the_head_deadline_and_the_cap_hold_on_h11_too() -> None:
    protocol = guarded_protocol(header_timeout_s=HEAD_S, max_connections=2, http="h11")
    with ThreadedServer(_hello, http=protocol) as server:
        s = _open(server.port)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert _read_all(s, timeout=HEAD_S + 10).startswith(b"HTTP/1.1 408 ")
        idle = [_open(server.port) for _ in range(3)]
        assert httpx.get(f"http://127.0.0.1:{server.port}/", timeout=10).text == "hi"
        assert sum(_read_all(s, timeout=HEAD_S + 10) == b"" for s in idle) == 3


def test_a_stream_whose_reader_stalls_is_ended_and_releases_its_ticket() -> None:
    """The client never reads; once the socket buffers are full the server's send blocks, and after
    ``send_timeout_s`` the response ends: the body generator is closed (what aborts the engine
    request in the frontend) and the admitted sequences are released."""
    guard = ClientGuard(server=ServerLimits(send_timeout_s=1.0))
    closed = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request

        from dynlogits.serve.http.closing_stream import ClosingStreamingResponse

        request = Request(scope, receive)
        hold_ticket(request, await guard.queue.acquire("c", 4))

        async def endless() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)
            finally:
                closed.set()

        await ClosingStreamingResponse(endless())(scope, receive, send)

    protocol = guarded_protocol(header_timeout_s=10, max_connections=10)
    with ThreadedServer(ClientGuardMiddleware(app, guard), http=protocol) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed.wait(30), "the stalled stream was never ended"
        wait_until(lambda: guard.queue.in_flight == 0, 10, "its ticket to be released")
        assert isinstance(guard.queue, FairQueue) and guard.queue.held("c") == 0
        # the connection is dropped, not left waiting for the reader to take what was buffered
        wait_until(lambda: not server.server.server_state.connections, 10, "the connection to be dropped")


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_connection_past_the_cap_while_every_one_serves_gets_a_503_and_lingering_refusals_do_not_count(
        http: str) -> None:
    """Cap 2, both connections serving (the app holds them): a third connection's request is answered
    503 with ``Retry-After`` and read in full up to the server's half-close (its request is read and
    dropped, so no reset discards the answer). While that refused connection stays open, it does not
    count: once one held request ends and its client closes, a new connection is served, and nothing
is shed to make room for it."""
    started = threading.Semaphore(0)
    release = {b"/1": threading.Event(), b"/2": threading.Event()}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.release()
        event = release.get(scope["raw_path"])
        if event is not None:
            await asyncio.get_running_loop().run_in_executor(None, event.wait, 60)
        await _hello(scope, receive, send)

    closed: list[str] = []
    protocol = guarded_protocol(header_timeout_s=60, max_connections=2, http=http, on_close=closed.append)
    with ThreadedServer(app, http=protocol) as server:
        held = {path: _open(server.port) for path in release}
        for path, s in held.items():
            s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert all(started.acquire(timeout=30) for _ in held), "the held requests never reached the app"
        refused = _open(server.port)
        refused.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n" + b"x" * 65536)
        answer = _read_all(refused, timeout=30)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower(), head
        assert b'"code": "server_busy"' in body and b"max_connections" in body, body
        release[b"/1"].set()
        assert _read_all(held[b"/1"], timeout=30).endswith(b"hi")
        held[b"/1"].close()
        # the refused connection is still open (the client has not closed it): it does not count
        assert httpx.get(f"http://127.0.0.1:{server.port}/", timeout=30).text == "hi"
        assert closed == ["connection_limit_refused"], "a lingering refusal was counted (and shed) at the cap"
        release[b"/2"].set()
        assert _read_all(held[b"/2"], timeout=30).endswith(b"hi")
        for s in (*held.values(), refused):
            s.close()


def test_refused_connections_linger_in_bounded_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``REFUSED_LINGERING_MAX`` refused connections left open by their clients, the oldest is
    closed when another is refused: a flood of refusals holds a bounded number of sockets."""
    from dynlogits.serve.http import connections

    monkeypatch.setattr(connections, "REFUSED_LINGERING_MAX", 2)
    started, release = threading.Semaphore(0), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.release()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        await _hello(scope, receive, send)

    protocol = guarded_protocol(header_timeout_s=60, max_connections=1, http="httptools")
    with ThreadedServer(app, http=protocol) as server:
        held = _open(server.port)
        held.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert started.acquire(timeout=30), "the held request never reached the app"
        refused = []
        for _ in range(5):
            s = _open(server.port)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_all(s, timeout=30).startswith(b"HTTP/1.1 503 ")  # the answer, then the half-close
            refused.append(s)  # left open by the client

        def lingering() -> int:
            return sum(bool(getattr(c, "_refused", False)) for c in list(server.server.server_state.connections))

        wait_until(lambda: lingering() <= 2, 30, "the oldest refused connections to be closed")
        assert lingering() == 2
        release.set()
        assert _read_all(held, timeout=30).endswith(b"hi")
        for s in (held, *refused):
            s.close()
