"""One engine request streamed to the worker's caller as NDJSON (:class:`EngineStream`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from dynlogits.serve.http.closing_stream import ClosingStreamingResponse

from ..protocol import GenerateChunk
from .state import WorkerState
from .worker_engine import WorkerEngine

__all__ = ["EngineStream"]

log = logging.getLogger("dynlogits.serve.worker")


class EngineStream(ClosingStreamingResponse):
    """One engine request streamed as NDJSON.

    However the response ends (finished, client gone before the first byte, or mid-stream) the
    request leaves ``in_flight`` exactly once, and an engine request whose stream did not run to
    its end (client gone, or an error mid-stream) is aborted and counted in ``aborted``. An engine
    error after the first chunk is reported in-band, and so is ``end(reason)`` (the drain deadline):
    the engine request is aborted, its last outputs dropped, and ``reason`` sent as the error.
    A request whose entries failed ends with its ``failure`` chunk, counted by reason in ``failures``.
    """

    def __init__(self, state: WorkerState, engine: WorkerEngine[Any], request_id: str, sequences: int, first: GenerateChunk,
                 stream: AsyncGenerator[GenerateChunk, None]) -> None:
        self._state, self._engine, self._request_id, self._stream = state, engine, request_id, stream
        self._sequences = sequences
        self._finished = False
        self._ended: str | None = None
        self._abort: asyncio.Task[None] | None = None
        super().__init__(self._ndjson(first), media_type="application/x-ndjson")
        state.streams.add(self)

    def end(self, reason: str) -> None:
        """End this request now with ``reason`` (in-band), aborting its engine request."""
        if self._ended is None and not self._finished:
            self._ended = reason
            self._abort = asyncio.create_task(self._engine.abort(self._request_id))

    async def _ndjson(self, first: GenerateChunk) -> AsyncGenerator[bytes, None]:
        """When the engine is ahead of the client every await here completes without suspending,
        so the ``sleep(0)`` per chunk is what lets the event loop notice a disconnect (and answer
        health checks) before the request runs to its end."""
        try:
            yield self._line(first)
            async for chunk in self._stream:
                if self._ended is None:  # after end(): the engine's abort outputs, not the client's
                    yield self._line(chunk)
                await asyncio.sleep(0)
            self._finished = True
            if self._ended is not None:
                self._state.stats.drain_aborted += 1
                yield GenerateChunk(error=self._ended).model_dump_json(exclude_none=True).encode() + b"\n"
        except Exception as err:  # noqa: BLE001 - reported in-band, the stream already started
            log.exception("request %s failed mid-stream", self._request_id)
            yield GenerateChunk(error=f"{type(err).__name__}: {err}").model_dump_json(exclude_none=True).encode() + b"\n"

    def _line(self, chunk: GenerateChunk) -> bytes:
        if chunk.failure is not None:
            failures = self._state.stats.failures
            failures[chunk.failure.reason] = failures.get(chunk.failure.reason, 0) + 1
            log.info("request %s failed in the engine (%s): %s", self._request_id, chunk.failure.reason,
                     chunk.failure.message)
        return chunk.model_dump_json(exclude_none=True).encode() + b"\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # closes the NDJSON body however it ends
        finally:
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
                if not self._finished:
                    self._state.stats.aborted += 1
                    await self._engine.abort(self._request_id)
            self._state.leave(self._sequences)
            self._state.streams.discard(self)
