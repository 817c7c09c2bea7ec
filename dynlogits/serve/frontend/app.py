"""The OpenAI-compatible app: models, chat and text completions (SSE or JSON), health, metrics."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.lowlevel
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from dynlogits.serve.http.asgi_errors import JsonErrors
from dynlogits.serve.http.closing_stream import ClosingStreamingResponse
from dynlogits.policy.config import DeploymentConfig
from dynlogits.serve.http.connections import parser_refused
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.serve.limits import RequestLimits, body_limit_problem
from dynlogits.specs import SpecError, parse_entries
from dynlogits.serve.http.bodies import (DEFAULT_MAX_BODY_BYTES, MAX_MESSAGE_CHARS, BodyError, clip, first_error, quote,
                                 read_json_body)
from dynlogits.serve.secret import presents_secret
from dynlogits.serve.protocol import GenerateChunk, GenerateRequest, Usage

from .fair_queue import ClientGone, QueueError
from .client_guard import ClientGuard, guard_of, hold_ticket
from .metrics import FrontendMetrics
from .openai_models import ChatCompletionRequest, CompletionRequest, RequestBody, unsupported_field
from .routing import NoWorkerError, Router, WorkerEndpoint, WorkerError, WorkerTimeoutError

__all__ = ["FrontendState", "create_app"]

log = logging.getLogger("dynlogits.serve.frontend")

Endpoint = Literal["chat", "completion"]
_FINISH = {"stop": "stop", "length": "length"}


class HTTPError(Exception):
    """An OpenAI-style error answer: ``status`` and the ``error`` object's fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None, retry_after_s: int | None = None) -> None:
        # whatever a message quotes of the request (a spec error may quote a value), a bounded echo
        message, param = clip(message, MAX_MESSAGE_CHARS), clip(param, MAX_MESSAGE_CHARS) if param else param
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=headers)


#: ``Retry-After`` (s) of a 503 while no worker is ready: about one readiness probe round, so a
#: client retrying then finds a worker that came back (a restarted one takes longer: it retries again).
RETRY_AFTER_S = 2


@dataclass
class FrontendState:
    router: Router
    config: DeploymentConfig
    metrics: FrontendMetrics
    #: Bodies larger than this are refused with 413 before they are read in full.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: The deployment's worker secret: a ``/health`` request presenting it gets the detailed view.
    worker_secret: str | None = field(default=None, repr=False)


#: ``code`` of a 400 for a request over a per-request limit (``dynlogits.serve.limits``).
LIMIT_EXCEEDED = "limit_exceeded"


def _validate(model: type[RequestBody], data: Any, config: DeploymentConfig,
              limits: RequestLimits | None = None) -> tuple[RequestBody, list[str]]:
    """The parsed body and its request kinds (its ``logits_processors`` and the kinds its
    ``logit_bias`` / ``allowed_token_ids`` / ``bad_words`` map onto); ``HTTPError(400)`` naming the
    first bad field. The per-request limits are checked first, on the raw JSON, then fields this
    frontend would not honour, then the body's model, then the entries."""
    if not isinstance(data, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    problem = body_limit_problem(data, limits or RequestLimits())
    if problem is not None:
        raise HTTPError(400, problem.message, param=problem.param, code=LIMIT_EXCEEDED)
    unsupported = unsupported_field(data)
    if unsupported is not None:
        raise HTTPError(400, unsupported[1], param=unsupported[0])
    try:
        body = model.model_validate(data)
    except ValidationError as err:
        bad = first_error(err.errors())
        raise HTTPError(400, bad.message, param=bad.param) from None
    own = body.logits_processors
    try:
        if own is not None and not isinstance(own, list):  # refused with the field's own error
            parse_entries(own, root="logits_processors", limits=config.limits,
                          allowed_kinds=sorted(config.allow_request_kinds))
        controls = with_controls(own, body.controls(), config, encode=None)
    except SpecError as err:
        raise HTTPError(400, str(err), param=err.problems[0].path) from None
    if own is None and not controls.entries:
        return body, controls.unresolved
    try:
        entries = parse_entries(controls.entries, root="logits_processors", limits=config.limits,
                                allowed_kinds=sorted(config.allow_request_kinds))
    except SpecError as err:
        renamed = rename_control_paths(err, controls.origins)
        raise HTTPError(400, str(renamed), param=renamed.problems[0].path) from None
    return body, [e.kind for e in entries] + controls.unresolved


async def _take_turn(guard: ClientGuard, request: Request, body: RequestBody) -> None:
    """Let the request's ``n`` sequences through the fair queue for its client (waiting in turn if
    the deployment is full); the ticket is released by ``ClientGuardMiddleware`` when the response ends.
    ``HTTPError`` 429 (or 400) when refused, ``ClientGone`` when the client left while waiting."""

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


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _ndjson_lines(response: httpx.Response, worker: WorkerEndpoint) -> AsyncIterator[bytes]:
    """Lines split on ``\n`` only. Not ``aiter_lines()``: it splits like ``str.splitlines``, also on
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


async def _chunks(response: httpx.Response, worker: WorkerEndpoint, router: Router) -> AsyncIterator[GenerateChunk]:
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


def create_app(state: FrontendState) -> FastAPI:
    router, config, metrics = state.router, state.config, state.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await router.probe_all()
        router.start()
        try:
            yield
        finally:
            await router.close()

    app = FastAPI(title="dynlogits frontend", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(JsonErrors, server="frontend", log=log)  # a bug answers a JSON 500, never a dropped connection

    def update_worker_gauges() -> None:
        for role, pool in router.pools.items():
            metrics.workers_ready.labels(role=role).set(sum(e.ready for e in pool.endpoints))

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """200 when a request can be served, else 503; each worker's role and readiness. Its URL and
        the last probe's error only for a caller presenting the worker secret (the operator)."""
        detailed = presents_secret(request.scope, state.worker_secret)
        workers = [{"url": e.url, "role": e.role, "ready": e.ready, "error": e.last_error} if detailed
                   else {"role": e.role, "ready": e.ready} for e in router.all_endpoints()]
        ok = router.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable", "workers": workers}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        update_worker_gauges()
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "dynlogits"}
                                           for m in router.model_names()]}

    async def prefill(worker_body: GenerateRequest) -> None:
        """Run the prompt on a prefill worker (one token, discarded): see ``launch/disagg.sh``."""
        sampling = worker_body.sampling.model_copy(update={"max_tokens": 1, "n": 1, "stop": []})
        body = worker_body.model_copy(update={"sampling": sampling, "request_id": worker_body.request_id + "-prefill"})
        worker, response = await router.open_stream(router.pools["prefill"], body.model_dump(exclude_none=True))
        try:
            async for _ in _chunks(response, worker, router):
                pass
        finally:
            await response.aclose()

    async def handle(endpoint: Endpoint, request: Request) -> Response:
        started = time.perf_counter()
        metrics.requests.labels(endpoint=endpoint).inc()

        def failed(err: HTTPError) -> JSONResponse:
            metrics.errors.labels(endpoint=endpoint, status=str(err.status)).inc()
            metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - started)
            return err.response()

        guard = guard_of(request)
        try:
            try:
                data = await read_json_body(request, max_bytes=state.max_body_bytes,
                                            timeout_s=guard.server.body_timeout_s)
            except ClientDisconnect:  # the body was cut short (or unparsable: the protocol answered 400)
                if not parser_refused(request.scope):
                    guard.protocol_error("body_incomplete", "the connection ended before the request body arrived")
                return Response(status_code=499)
            except BodyError as err:
                if err.status == 408:
                    guard.closed("body_timeout")
                raise HTTPError(err.status, err.message, param=err.param, code=err.code) from None
            try:
                body, kinds = _validate(ChatCompletionRequest if endpoint == "chat" else CompletionRequest, data,
                                        config, guard.request_limits)
            except HTTPError as err:
                if err.code == LIMIT_EXCEEDED:
                    guard.refused("request_limit")
                raise
            names = router.model_names()
            if not names:
                raise NoWorkerError("no worker is ready yet, so no model is served; retry shortly")
            if body.model not in names:
                raise HTTPError(404, f"model {quote(body.model)} does not exist (served: {names})", param="model",
                                code="model_not_found")
            await _take_turn(guard, request, body)
            rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
            prompt: dict[str, Any] = (
                {"messages": body.chat_messages()} if isinstance(body, ChatCompletionRequest)
                else body.prompt_fields())  # type: ignore[attr-defined]
            worker_body = GenerateRequest(request_id=rid, sampling=body.sampling(), extra_args=body.client_extra_args(),
                                          logits_processors=body.logits_processors, **body.controls(), **prompt)
            if router.disaggregated:
                await prefill(worker_body)
            worker, response = await router.open_stream(router.generation_pool,
                                                        worker_body.model_dump(exclude_none=True))
        except HTTPError as err:
            return failed(err)
        except ClientGone:  # it left while waiting in the queue: nobody reads an answer
            return Response(status_code=499)
        except NoWorkerError as err:
            return failed(HTTPError(503, str(err), kind="service_unavailable", retry_after_s=RETRY_AFTER_S))
        except WorkerTimeoutError as err:
            return failed(HTTPError(504, str(err), kind="worker_error", code="worker_timeout"))
        except WorkerError as err:
            metrics.errors.labels(endpoint=endpoint, status=str(err.status)).inc()
            return Response(err.body, status_code=err.status, media_type="application/json")

        deployment_kinds = worker.info.deployment_kinds if worker.info else []
        make = _chat_payloads(rid, body.model) if endpoint == "chat" else _completion_payloads(rid, body.model)

        def done(status: int | None = None) -> None:
            if status is not None:
                metrics.errors.labels(endpoint=endpoint, status=str(status)).inc()
            metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - started)

        if body.stream:
            return ClosingStreamingResponse(_stream(response, worker, make, body.include_usage, kinds,
                                                    deployment_kinds, done), media_type="text/event-stream")
        with metrics.processors_active(kinds, deployment_kinds):
            try:
                texts: dict[int, list[str]] = {}
                finish: dict[int, str | None] = {}
                usage: Usage | None = None
                async for chunk in _chunks(response, worker, router):
                    if chunk.usage is not None:
                        usage = chunk.usage
                        continue
                    texts.setdefault(chunk.index, []).append(chunk.text)
                    if chunk.finish_reason:
                        finish[chunk.index] = chunk.finish_reason
            except HTTPError as err:
                return failed(err)
            finally:
                await response.aclose()
        done()
        return JSONResponse(make.final({i: "".join(t) for i, t in sorted(texts.items())}, finish, usage))

    async def _stream(response: httpx.Response, worker: WorkerEndpoint, make: _Payloads, include_usage: bool,
                      kinds: list[str], deployment_kinds: list[str],
                      done: Callable[[int | None], None]) -> AsyncIterator[bytes]:
        status: int | None = None
        with metrics.processors_active(kinds, deployment_kinds):
            try:
                usage: Usage | None = None
                async for chunk in _chunks(response, worker, router):
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
                yield _sse({"error": {"message": err.message, "type": err.kind, "param": None, "code": None}})
                yield b"data: [DONE]\n\n"
            finally:
                # Shielded: when the client went away this scope is cancelled, and the close is
                # what tells the worker to abort the engine request.
                with anyio.CancelScope(shield=True):
                    await response.aclose()
                done(status)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle("completion", request)

    return app


class _Payloads:
    """Builds OpenAI response objects for one request."""

    object_final = ""
    object_chunk = ""

    def __init__(self, rid: str, model: str) -> None:
        self.rid, self.model, self.created = rid, model, int(time.time())
        self._started: set[int] = set()

    def _envelope(self, obj: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, **fields}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self._envelope(self.object_chunk, choices=[], usage=usage.model_dump())

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        raise NotImplementedError

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        raise NotImplementedError


class _chat_payloads(_Payloads):  # noqa: N801 - used like a factory
    object_final, object_chunk = "chat.completion", "chat.completion.chunk"

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if chunk.index not in self._started:
            self._started.add(chunk.index)
            delta["role"] = "assistant"
        delta["content"] = chunk.text
        choice = {"index": chunk.index, "delta": delta, "logprobs": None,
                  "finish_reason": _FINISH.get(chunk.finish_reason or "", "stop") if chunk.finish_reason else None}
        return self._envelope(self.object_chunk, choices=[choice])

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None,
                    "finish_reason": _FINISH.get(finish.get(i) or "", "stop")} for i, t in texts.items()]
        return self._envelope(self.object_final, choices=choices, usage=usage.model_dump() if usage else None)


class _completion_payloads(_Payloads):  # noqa: N801
    object_final = object_chunk = "text_completion"

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        choice = {"index": chunk.index, "text": chunk.text, "logprobs": None,
                  "finish_reason": _FINISH.get(chunk.finish_reason or "", "stop") if chunk.finish_reason else None}
        return self._envelope(self.object_chunk, choices=[choice])

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": _FINISH.get(finish.get(i) or "", "stop")}
                   for i, t in texts.items()]
        return self._envelope(self.object_final, choices=choices, usage=usage.model_dump() if usage else None)
