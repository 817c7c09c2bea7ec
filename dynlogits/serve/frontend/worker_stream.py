"""Reading a worker's ``/generate`` answer: its NDJSON lines as :class:`GenerateChunk` objects, each
failure of the worker or its connection as an ``HTTPError`` for the client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
from pydantic import ValidationError

from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.protocol import GenerateChunk

from .routing import Router, WorkerEndpoint

__all__ = ["worker_chunks"]


async def _ndjson_lines(response: httpx.Response, worker: WorkerEndpoint) -> AsyncIterator[bytes]:
    """Lines split on ``\\n`` only. Not ``aiter_lines()``: it splits like ``str.splitlines``, also on
    U+0085 and U+2028, which JSON leaves unescaped and a model may well generate. Each read marks
    ``worker.last_data`` (the readiness probe's evidence that a slow worker is busy, not hung)."""
    pending = b""
    async for data in response.aiter_bytes():
        worker.last_data = time.monotonic()
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


async def worker_chunks(response: httpx.Response, worker: WorkerEndpoint, router: Router) -> AsyncIterator[GenerateChunk]:
    """The worker's NDJSON chunks; ``HTTPError`` when the worker reports an error or its stream breaks
    (a worker that dies mid-request ends the client's request with a 502 saying so, never a hang), or
    sends nothing for the router's idle timeout (504; the worker is taken out of rotation)."""
    try:
        async for line in _ndjson_lines(response, worker):
            if line.strip():
                chunk = GenerateChunk.model_validate_json(line)
                if chunk.error:
                    raise HTTPError(500, f"worker failed mid-request: {chunk.error}", kind="internal_error")
                yield chunk
    except httpx.ReadTimeout:
        router.take_out(worker, router.idle_reason())
        raise HTTPError(504, f"the worker {router.idle_reason()} mid-request; the request was ended and the worker "
                        "is out of rotation until it answers again; retry it", kind="worker_error",
                        code="worker_timeout") from None
    except httpx.HTTPError as err:
        raise HTTPError(502, f"the worker's connection was lost mid-request ({type(err).__name__}); "
                        "the request did not complete, retry it", kind="worker_error", code="worker_lost") from None
    except ValidationError as err:
        raise HTTPError(502, f"the worker sent a malformed chunk: {err.errors()[0]['msg']}",
                        kind="worker_error") from None
