"""Reading a worker's ``/generate`` answer: its NDJSON lines as :class:`GenerateChunk` objects, each
failure of the worker or its connection as an ``HTTPError`` for the client, and a request whose
logits-processor entries failed as an :class:`EntryFailureError` (OpenAI's error shape: ``type``
``logits_processor_error``, ``code`` the reason, ``param`` the failing entry's path)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
from pydantic import ValidationError

from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.protocol import EntryFailure, GenerateChunk

from .routing import Router, WorkerEndpoint

__all__ = ["ENTRY_FAILURE_STATUS", "ENTRY_FAILURE_TYPE", "EntryFailureError", "worker_chunks"]

#: The error ``type`` of a request whose entries failed while it generated.
ENTRY_FAILURE_TYPE = "logits_processor_error"
#: The status per reason: the request's entries cannot be met for it (422: retrying it fails the
#: same way), or a processor raised (500); any other reason is a 500.
ENTRY_FAILURE_STATUS = {"no_token_left": 422, "not_realized": 422, "processor_error": 500}


class EntryFailureError(HTTPError):
    """The worker reported that the request's logits-processor entries failed (``reason``)."""

    def __init__(self, failure: EntryFailure) -> None:
        super().__init__(ENTRY_FAILURE_STATUS.get(failure.reason, 500), failure.message, param=failure.param,
                         kind=ENTRY_FAILURE_TYPE, code=failure.reason)
        self.reason = failure.reason


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
                if chunk.failure is not None:
                    raise EntryFailureError(chunk.failure)
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
