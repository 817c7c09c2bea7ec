"""``ClosingStreamingResponse``: a body's ``finally`` (closing the upstream, aborting the engine
request) runs as soon as the client goes away, not when the generator is garbage collected.

Driven through the ASGI interface the way uvicorn drives it (spec 2.3): the client disconnects
while the response is inside ``send``. Starlette's own ``StreamingResponse`` is the contrast."""

from __future__ import annotations

import gc
from typing import Any

import anyio
from starlette.responses import StreamingResponse

from dynlogits.serve.http.closing_stream import ClosingStreamingResponse


async def _serve_until_disconnect(response_cls: type[StreamingResponse]) -> tuple[list[str], Any]:
    """Serve one response whose client hangs up during the second body ``send``; returns what the
    body recorded by the time the response returned, and the response (kept alive)."""
    events: list[str] = []
    hung_up = anyio.Event()

    async def body() -> Any:
        try:
            for i in range(1000):
                yield f"chunk {i}\n"
        finally:
            events.append("body closed")

    sends = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal sends
        sends += 1
        if sends == 3:  # start, chunk 0, then chunk 1: the client is gone while this write waits
            hung_up.set()
            await anyio.sleep(10)

    async def receive() -> dict[str, Any]:
        await hung_up.wait()
        return {"type": "http.disconnect"}

    response = response_cls(body(), media_type="text/plain")
    with anyio.fail_after(5):
        await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
    return list(events), response


def test_the_body_is_closed_when_the_client_hangs_up_during_a_send() -> None:
    events, _ = anyio.run(_serve_until_disconnect, ClosingStreamingResponse)
    assert events == ["body closed"]


def test_starlettes_own_response_leaves_the_body_suspended_until_collected() -> None:
    """Why the class exists: with the plain response nothing closes the body when the client goes."""
    events, response = anyio.run(_serve_until_disconnect, StreamingResponse)
    assert events == []
    del response
    gc.collect()


def test_a_body_that_runs_to_its_end_is_sent_whole_and_closed_once() -> None:
    closed: list[int] = []

    async def body() -> Any:
        try:
            yield b"only"
        finally:
            closed.append(1)

    async def run() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            await anyio.sleep(10)
            return {"type": "http.disconnect"}

        await ClosingStreamingResponse(body())({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
        return sent

    sent = anyio.run(run)
    assert [m.get("body") for m in sent[1:]] == [b"only", b""]
    assert closed == [1]
