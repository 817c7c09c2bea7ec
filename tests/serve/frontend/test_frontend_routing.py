"""The frontend's readiness probing against a real TCP server speaking HTTP: workers that go away and
come back on the same port are noticed, and a probe round that fails or hangs does not end probing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest

from dynlogits.serve.frontend import routing
from dynlogits.serve.frontend.routing import Router
from dynlogits.tools.ports import free_port_block

INFO = {"model": "m", "role": "agg", "backend": "vllm", "max_model_len": 64, "vocab_size": 32}


async def _serve_ready(port: int) -> asyncio.Server:
    """A worker's ``GET /ready`` as the real worker answers it: 200 with its WorkerInfo JSON. Each
    connection serves one request, so once the server is closed every probe finds the port refusing,
    as after a worker's death."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = json.dumps(INFO).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)


async def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _serve_ready_closing_reused_connections(port: int, connections: list[int]) -> asyncio.Server:
    """``GET /ready`` answered with a kept-alive connection that the server closes when a second
    request arrives on it, as uvicorn does when its keep-alive timeout fires just as a request comes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = json.dumps(INFO).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # a reused connection: closed without an answer
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)


def test_probes_never_reuse_a_connection_the_worker_may_be_closing() -> None:
    async def main() -> None:
        port = free_port_block(1)
        connections: list[int] = []
        server = await _serve_ready_closing_reused_connections(port, connections)
        router = Router({"agg": [f"http://127.0.0.1:{port}"]})
        endpoint = router.all_endpoints()[0]
        try:
            for i in range(5):
                await router.probe(endpoint)
                assert endpoint.ready, (i, endpoint.last_error)
            assert len(connections) == 5
        finally:
            server.close()
            await router.close()

    asyncio.run(main())


def test_a_worker_that_goes_away_and_comes_back_on_its_port_is_noticed() -> None:
    async def main() -> None:
        port = free_port_block(1)
        router = Router({"agg": [f"http://127.0.0.1:{port}"]}, health_interval_s=0.05)
        endpoint = router.all_endpoints()[0]
        router.start()
        try:
            server = await _serve_ready(port)
            assert await _until(lambda: endpoint.ready, 10), endpoint
            assert router.model_names() == ["m"]
            server.close()
            await server.wait_closed()
            assert await _until(lambda: not endpoint.ready, 10), endpoint
            assert router.model_names() == []
            server = await _serve_ready(port)
            assert await _until(lambda: endpoint.ready, 10), endpoint
            server.close()
        finally:
            await router.close()

    asyncio.run(main())


@pytest.mark.parametrize("failure", ["raises", "hangs"])
def test_a_probe_round_that_raises_or_hangs_does_not_end_probing(
        failure: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        port = free_port_block(1)
        router = Router({"agg": [f"http://127.0.0.1:{port}"]}, health_interval_s=0.05, round_timeout_s=0.3)
        endpoint = router.all_endpoints()[0]
        real: Callable[[], Awaitable[None]] = router.probe_all
        rounds = 0

        async def first_round_fails() -> None:
            nonlocal rounds
            rounds += 1
            if rounds == 1:
                if failure == "raises":
                    raise RuntimeError("an error no probe expects")
                await asyncio.Event().wait()  # never set: a stuck probe
            await real()

        monkeypatch.setattr(router, "probe_all", first_round_fails)
        server = await _serve_ready(port)
        router.start()
        try:
            assert await _until(lambda: endpoint.ready, 10), (rounds, endpoint)
        finally:
            server.close()
            await router.close()
        assert rounds >= 2

    with caplog.at_level("ERROR", logger="dynlogits.serve.frontend"):
        asyncio.run(main())
    assert "worker readiness probe failed" in caplog.text


async def _serve_silently(port: int, probes: list[int]) -> asyncio.Server:
    """A worker whose event loop is saturated (or stopped): it accepts ``GET /ready`` and never
    answers; ``probes`` counts the probes received."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            probes.append(1)
            await reader.read()  # until the prober gives up and closes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)


@pytest.mark.parametrize("streaming", [True, False], ids=["busy_streaming", "silent"])
def test_late_probes_take_out_a_silent_worker_but_not_one_that_is_streaming(
        streaming: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes that time out take a worker out after PROBE_TIMEOUTS_TO_DOWN in a row only while no
    request's stream hears from it: a saturated worker answers /ready late but keeps streaming."""
    monkeypatch.setattr(routing, "PROBE_TIMEOUT_S", 0.2)

    async def main() -> None:
        port = free_port_block(1)
        router = Router({"agg": [f"http://127.0.0.1:{port}"]}, health_interval_s=0.02)
        endpoint = router.all_endpoints()[0]
        endpoint.ready = True  # it answered before; now its loop is busy (or stopped)
        probes: list[int] = []
        server = await _serve_silently(port, probes)

        async def stream() -> None:  # what _chunks does on every read from the worker's stream
            while True:
                endpoint.last_data = time.monotonic()
                await asyncio.sleep(0.01)

        streamer = asyncio.create_task(stream()) if streaming else None
        router.start()
        try:
            wanted = routing.PROBE_TIMEOUTS_TO_DOWN + 2
            assert await _until(lambda: len(probes) >= wanted or not endpoint.ready, 30), (probes, endpoint)
            if streaming:
                assert endpoint.ready, endpoint
                assert len(probes) >= wanted
            else:
                assert not endpoint.ready
                assert "not answering" in (endpoint.last_error or "")
                assert len(probes) >= routing.PROBE_TIMEOUTS_TO_DOWN
        finally:
            if streamer is not None:
                streamer.cancel()
            server.close()
            await router.close()

    asyncio.run(main())
