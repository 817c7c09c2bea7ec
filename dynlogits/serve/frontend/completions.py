"""``POST /v1/chat/completions`` and ``POST /v1/completions``: one request through the frontend's steps.

pace a client whose bodies cost too much CPU (``.pacing``) -> read the body -> validate it
(``.validation``) -> check its model is served -> take its turn in the fair
queue -> open a worker's stream (after a prefill worker's pass when disaggregated) -> stream the
answer as SSE, or aggregate it into one JSON object. Every request is counted; an error answer is
counted with its status, and every answer but a relayed worker error with its latency.

A request whose logits-processor entries failed while it generated (``EntryFailureError``) is never
answered with a plain ``stop``: aggregated, it is that error (422, or 500 for a processor that
raised); streamed, the chunks so far, then one error event with the same ``error`` object, then
``data: [DONE]``, as vLLM's own server ends a stream that fails mid-way (``vllm/entrypoints/openai/
chat_completion/serving.py``, ``chat_completion_stream_generator``: the error event from
``create_streaming_error_response``, then ``data: [DONE]``). Counted in ``dynlogits_request_failures``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from dynlogits.serve.http.bodies import BodyError, quote, read_json_body
from dynlogits.serve.http.closing_stream import ClosingStreamingResponse
from dynlogits.serve.http.connections import parser_refused
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.protocol import GenerateRequest, Usage

from .client_guard import guard_of, hold_ticket
from .fair_queue import ClientGone, QueueError
from .openai_models import ChatCompletionRequest, CompletionRequest, RequestBody
from .pacing import COST_FACTOR, carries_entries
from .payloads import Endpoint, Payloads, payloads_for
from .routing import NoWorkerError, WorkerEndpoint, WorkerError, WorkerTimeoutError
from .state import FrontendState
from .validation import LIMIT_EXCEEDED, validate_request
from .worker_stream import EntryFailureError, worker_chunks

__all__ = ["RETRY_AFTER_S", "CompletionCall"]

#: ``Retry-After`` (s) of a 503 while no worker is ready: about one readiness probe round, so a
#: client retrying then finds a worker that came back (a restarted one takes longer: it retries again).
RETRY_AFTER_S = 2


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class CompletionCall:
    """One completion request of ``endpoint``; :meth:`answer` runs the steps and returns the response."""

    def __init__(self, state: FrontendState, endpoint: Endpoint, request: Request) -> None:
        self.state, self.endpoint, self.request = state, endpoint, request
        self.guard = guard_of(request)
        self.started = time.perf_counter()

    async def answer(self) -> Response:
        """The response; a client gone before it is answered gets a bare 499 (nobody reads it)."""
        metrics = self.state.metrics
        metrics.requests.labels(endpoint=self.endpoint).inc()
        try:
            await self.pace()
            body, kinds = self.validate(await self.read_body())
            self.check_model(body)
            await self.take_turn(body)
            rid = f"{'chatcmpl' if self.endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
            worker, response = await self.open_worker_stream(body.generate_request(rid))
        except HTTPError as err:
            return self.failed(err)
        except ClientGone:
            return Response(status_code=499)
        except NoWorkerError as err:
            return self.failed(HTTPError(503, str(err), kind="service_unavailable", retry_after_s=RETRY_AFTER_S))
        except WorkerTimeoutError as err:
            return self.failed(HTTPError(504, str(err), kind="worker_error", code="worker_timeout"))
        except WorkerError as err:  # relayed as the worker answered it
            metrics.errors.labels(endpoint=self.endpoint, status=str(err.status)).inc()
            return Response(err.body, status_code=err.status, media_type="application/json")
        deployment_kinds = worker.info.deployment_kinds if worker.info else []
        make = payloads_for(self.endpoint, rid, body.model)
        if body.stream:
            return ClosingStreamingResponse(self.stream(response, worker, make, body.include_usage, kinds,
                                                        deployment_kinds), media_type="text/event-stream")
        return await self.aggregate(response, worker, make, kinds, deployment_kinds)

    async def read_body(self) -> Any:
        """The body's JSON, within the size and time limits; ``ClientGone`` when it was cut short."""
        try:
            return await read_json_body(self.request, max_bytes=self.state.max_body_bytes,
                                        timeout_s=self.guard.server.body_timeout_s)
        except ClientDisconnect:  # the body was cut short (or unparsable: the protocol answered 400)
            if not parser_refused(self.request.scope):
                self.guard.protocol_error("body_incomplete", "the connection ended before the request body arrived")
            raise ClientGone() from None
        except BodyError as err:
            if err.status == 408:
                self.guard.closed("body_timeout")
            raise HTTPError(err.status, err.message, param=err.param, code=err.code) from None

    async def pace(self) -> None:
        """Wait while this client's CPU debt for its bodies is over its burst (``.pacing``: a costly
        client is slowed, the others are not); 429 when the wait would outlast ``queue_timeout``."""
        guard = self.guard
        wait = guard.pacer.wait_s(guard.client(self.request.scope))
        if wait <= 0:
            return
        limit = guard.server.queue_timeout_s
        if wait > limit:
            guard.refused("client_cpu")
            raise HTTPError(429, f"this client's requests cost {wait * guard.pacer.rate_ms_per_s:.0f} ms of CPU more "
                                 f"than its share ({guard.pacer.rate_ms_per_s:g} ms/s, burst {guard.pacer.burst_ms:g} "
                                 f"ms; limit client_cpu_ms_per_s); retry in {wait:.0f} s",
                            kind="rate_limit_exceeded", code="rate_limit_exceeded", retry_after_s=max(1, round(wait)))
        if guard.metrics is not None:
            guard.metrics.paced.inc()
            guard.metrics.paced_seconds.inc(wait)
        await anyio.sleep(wait)

    def validate(self, data: Any) -> tuple[RequestBody, list[str]]:
        """The body as validated and its request kinds (``.validation``); a refusal over a per-request
        limit is counted as one. For a body carrying logits entries (or controls mapped onto them) its
        CPU, scaled to the whole path's (``pacing.COST_FACTOR``), is charged to the client, refused
        or not."""
        model = ChatCompletionRequest if self.endpoint == "chat" else CompletionRequest
        started = time.thread_time()
        try:
            return validate_request(model, data, self.state.config, self.guard.request_limits)
        except HTTPError as err:
            if err.code == LIMIT_EXCEEDED:
                self.guard.refused("request_limit")
            raise
        finally:
            if carries_entries(data):
                spent_ms = (time.thread_time() - started) * 1000 * COST_FACTOR
                self.guard.pacer.charge(self.guard.client(self.request.scope), spent_ms)

    def check_model(self, body: RequestBody) -> None:
        """``NoWorkerError`` while no model is served, ``HTTPError(404)`` for a model that is not."""
        names = self.state.router.model_names()
        if not names:
            raise NoWorkerError("no worker is ready yet, so no model is served; retry shortly")
        if body.model not in names:
            raise HTTPError(404, f"model {quote(body.model)} does not exist (served: {names})", param="model",
                            code="model_not_found")

    async def take_turn(self, body: RequestBody) -> None:
        """Let the request's ``n`` sequences through the fair queue for its client (waiting in turn if
        the deployment is full); the ticket is released by ``ClientGuardMiddleware`` when the response
        ends. ``HTTPError`` 429 (or 400) when refused, ``ClientGone`` when the client left while waiting."""
        guard, request = self.guard, self.request

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        try:
            ticket = await guard.queue.acquire(guard.client(request.scope), body.n, disconnected=gone)
        except QueueError as err:
            guard.refused(err.reason)
            raise HTTPError(err.status, err.message, param=err.param, code="rate_limit_exceeded" if err.status == 429
                            else LIMIT_EXCEEDED, retry_after_s=err.retry_after_s) from None
        except ClientGone:
            guard.refused("client_gone")
            raise
        finally:
            guard.update_gauges()
        hold_ticket(request, ticket)

    async def open_worker_stream(self, worker_body: GenerateRequest) -> tuple[WorkerEndpoint, httpx.Response]:
        """A generation worker's open ``/generate`` stream; when disaggregated, the prompt runs on a
        prefill worker first (one token, discarded: see ``launch/disagg.sh``)."""
        router = self.state.router
        if router.disaggregated:
            sampling = worker_body.sampling.model_copy(update={"max_tokens": 1, "n": 1, "stop": []})
            prefill = worker_body.model_copy(update={"sampling": sampling,
                                                     "request_id": worker_body.request_id + "-prefill"})
            worker, response = await router.open_stream(router.pools["prefill"], prefill.model_dump(exclude_none=True))
            try:
                async for _ in worker_chunks(response, worker, router):
                    pass
            finally:
                await response.aclose()
        return await router.open_stream(router.generation_pool, worker_body.model_dump(exclude_none=True))

    async def stream(self, response: httpx.Response, worker: WorkerEndpoint, make: Payloads, include_usage: bool,
                     kinds: list[str], deployment_kinds: list[str]) -> AsyncIterator[bytes]:
        """The worker's chunks as SSE events, then ``[DONE]``; a failure mid-stream is an error event
        (OpenAI's ``error`` object, as an error answer's body), then ``[DONE]``. Closing the worker's
        stream, however this ends, is what aborts its engine request."""
        status: int | None = None
        with self.state.metrics.processors_active(kinds, deployment_kinds):
            try:
                usage: Usage | None = None
                async for chunk in worker_chunks(response, worker, self.state.router):
                    if chunk.usage is not None:
                        usage = chunk.usage
                        continue
                    yield _sse(make.delta(chunk))
                    # When the worker is ahead, reads from its stream complete without
                    # suspending; without this checkpoint the loop never sees the client hang up.
                    await anyio.lowlevel.checkpoint()
                if include_usage and usage is not None:
                    yield _sse(make.usage_chunk(usage))
                yield b"data: [DONE]\n\n"
            except HTTPError as err:
                status = err.status
                self.count_failure(err)
                yield _sse({"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}})
                yield b"data: [DONE]\n\n"
            finally:
                # Shielded: when the client went away this scope is cancelled, and the close is
                # what tells the worker to abort the engine request.
                with anyio.CancelScope(shield=True):
                    await response.aclose()
                self.finished(status)

    async def aggregate(self, response: httpx.Response, worker: WorkerEndpoint, make: Payloads, kinds: list[str],
                        deployment_kinds: list[str]) -> Response:
        """The worker's whole answer as one JSON object (choices in index order)."""
        with self.state.metrics.processors_active(kinds, deployment_kinds):
            try:
                texts: dict[int, list[str]] = {}
                finish: dict[int, str | None] = {}
                usage: Usage | None = None
                async for chunk in worker_chunks(response, worker, self.state.router):
                    if chunk.usage is not None:
                        usage = chunk.usage
                        continue
                    texts.setdefault(chunk.index, []).append(chunk.text)
                    if chunk.finish_reason:
                        finish[chunk.index] = chunk.finish_reason
            except HTTPError as err:
                self.count_failure(err)
                return self.failed(err)
            finally:
                await response.aclose()
        self.finished()
        return JSONResponse(make.final({i: "".join(t) for i, t in sorted(texts.items())}, finish, usage))

    def count_failure(self, err: HTTPError) -> None:
        """Count ``err`` by reason when it says the request's entries failed."""
        if isinstance(err, EntryFailureError):
            self.state.metrics.failures.labels(endpoint=self.endpoint, reason=err.reason).inc()

    def failed(self, err: HTTPError) -> JSONResponse:
        """``err``'s answer, counted."""
        self.finished(err.status)
        return err.response()

    def finished(self, status: int | None = None) -> None:
        """Count the answer: its error ``status`` (``None``: no error) and its latency."""
        metrics = self.state.metrics
        if status is not None:
            metrics.errors.labels(endpoint=self.endpoint, status=str(status)).inc()
        metrics.latency.labels(endpoint=self.endpoint).observe(time.perf_counter() - self.started)
