"""The worker's HTTP app: ``/generate`` (NDJSON stream), ``/health``, ``/ready``, ``/stats``.

Every route but ``/health`` (liveness) needs the deployment's worker secret when one is set
(``dynlogits.serve.secret``); ``/generate`` keeps its own bound on the sequences in flight
(``--max-inflight-sequences``), whoever calls it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from dynlogits.serve.http.asgi_errors import JsonErrors
from dynlogits.serve.http.closing_stream import ClosingStreamingResponse
from dynlogits.policy.config import DeploymentConfig
from dynlogits.serve.http.connections import parser_refused
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.policy.request import RequestPolicy, build_policy
from dynlogits.serve.http.protocol_errors import ProtocolErrorLog
from dynlogits.serve.limits import generate_limit_problem
from dynlogits.policy.roles import is_generation_stage
from dynlogits.specs import SpecError
from dynlogits.policy.hook import test_hook_enabled
from dynlogits.serve.http.bodies import (DEFAULT_MAX_BODY_BYTES, MAX_MESSAGE_CHARS, BodyError, clip, first_error,
                                 read_json_body)
from dynlogits.serve.secret import RequireWorkerSecret

from .args import DEFAULT_MODEL_NAME, WorkerArgs
from .vllm_engine import EngineRequestError, VllmEngine, start_vllm_engine
from .introspect import adapter_requests, process_tree_rss
from ..protocol import ErrorBody, ErrorDetail, GenerateChunk, GenerateRequest, WorkerInfo, WorkerStats

__all__ = ["WorkerState", "create_app"]

log = logging.getLogger("dynlogits.serve.worker")

#: The frontend re-encodes a client body (escapes may grow it); the worker's own bound is looser.
MAX_GENERATE_BODY_BYTES = 4 * DEFAULT_MAX_BODY_BYTES


@dataclass
class WorkerState:
    """Everything the handlers share; ``engine``/``policy`` are set once the engine is up."""

    args: WorkerArgs
    config: DeploymentConfig
    engine: VllmEngine | None = None
    policy: RequestPolicy | None = None
    start_error: str | None = None
    stats: WorkerStats = field(default_factory=WorkerStats)
    ids: itertools.count = field(default_factory=itertools.count)
    on_fatal: Any = None  # called when the engine cannot start, or dies: the worker then exits
    #: Set on SIGTERM: in-flight requests finish, new ones get 503 so the frontend routes elsewhere.
    draining: bool = False
    #: The streams in flight, so the drain deadline can end the ones still running.
    streams: set[_EngineStream] = field(default_factory=set)
    #: Client protocol errors on this worker's port: counted (in ``/stats``), logged at most once a minute per kind.
    protocol_errors: ProtocolErrorLog = field(default_factory=lambda: ProtocolErrorLog(log))

    def enter(self, sequences: int) -> None:
        """A request of ``sequences`` is in flight (until :meth:`leave`)."""
        self.stats.in_flight += 1
        self.stats.in_flight_sequences += sequences

    def leave(self, sequences: int) -> None:
        self.stats.in_flight -= 1
        self.stats.in_flight_sequences -= sequences

    @property
    def engine_dead(self) -> str | None:
        """Why the engine died, or ``None`` while it lives (or has not started)."""
        return self.stats.engine_dead

    def drain(self, deadline_s: float) -> None:
        """SIGTERM: refuse new requests now; streams still running after ``deadline_s`` are ended
        with an in-band error and their engine requests aborted (call on the event loop)."""
        self.draining = True
        asyncio.get_running_loop().call_later(deadline_s, self._end_streams, deadline_s)

    def _end_streams(self, deadline_s: float) -> None:
        if self.streams:
            log.warning("drain deadline (%g s) passed: ending %d request(s) still in flight", deadline_s,
                        len(self.streams))
        for stream in list(self.streams):
            stream.end(f"the worker is shutting down and its drain deadline ({deadline_s:g} s) passed before this "
                       "request finished; it was aborted, retry it")

    @property
    def register_adapter(self) -> bool:
        """Adapter only where the role generates and some spec source is active."""
        return is_generation_stage(self.args.disaggregation_mode) and (self.config.active or test_hook_enabled())

    def info(self) -> WorkerInfo:
        assert self.engine is not None and self.policy is not None
        deployment = self.policy.deployment
        return WorkerInfo(
            model=self.engine.model_name, role=self.args.disaggregation_mode.value, backend=self.args.backend,
            max_model_len=self.engine.max_model_len, vocab_size=self.engine.vocab_size,
            deployment_kinds=[e.kind for e in deployment.entries] if deployment and self.policy.generates else [],
            allow_request_kinds=sorted(self.config.allow_request_kinds),
            adapter_registered=self.engine.adapter_registered,
        )


def _error(status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error",
           headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer; the message and param are bounded, whatever they quote of the request."""
    body = ErrorBody(error=ErrorDetail(message=clip(message, MAX_MESSAGE_CHARS), type=kind,
                                       param=clip(param, MAX_MESSAGE_CHARS) if param else param))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _start_engine(state: WorkerState) -> None:
    from dynlogits.model_builder import default_model_dir

    args = state.args
    model = args.model or str(default_model_dir())
    served = args.served_model_name or (args.model or DEFAULT_MODEL_NAME)
    if args.backend == "sglang":
        from .sglang_engine import start_sglang_engine

        engine = start_sglang_engine(model, served, args.engine_args, register_adapter=state.register_adapter)
    else:
        engine = start_vllm_engine(model, served, args.engine_args, register_adapter=state.register_adapter)
    state.policy = build_policy(args.disaggregation_mode, state.config, lambda: engine.tokenizer, engine.vocab_size)
    state.engine = engine


#: How often the worker checks that its engine lives (a property read, no engine call).
ENGINE_WATCH_INTERVAL_S = 0.5


async def _watch_engine(state: WorkerState) -> None:
    """Once the engine has died (its core process gone: vLLM's ``errored``), record why, log it
    once and have the worker exit (``on_fatal``) so that its supervisor can start a new one: a
    worker whose engine is dead can never serve again. In-flight requests end on their own with
    the engine's error."""
    while state.engine is None:
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
    engine = state.engine.engine
    while not getattr(engine, "errored", False):
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
    cause = getattr(engine, "dead_error", None)
    state.stats.engine_dead = f"{type(cause).__name__}: {cause}" if cause is not None else "engine errored"
    log.error("engine died (%s); the worker exits (status %d) so that its supervisor can start a new one",
              state.stats.engine_dead, ENGINE_DEAD_EXIT)
    if state.on_fatal is not None:
        state.on_fatal()


#: Exit status of a worker whose engine died (1: could not start, 2: bad config).
ENGINE_DEAD_EXIT = 3


def create_app(state: WorkerState) -> FastAPI:
    """The worker app; the engine starts in a thread at start-up so ``/health`` answers meanwhile."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def start() -> None:
            try:
                await asyncio.to_thread(_start_engine, state)
                log.info("worker ready: role=%s model=%s adapter=%s", state.args.disaggregation_mode.value,
                         state.engine.model_name if state.engine else "?", state.register_adapter)
            except Exception as err:  # noqa: BLE001 - reported on /ready and fatal
                state.start_error = f"{type(err).__name__}: {err}"
                log.exception("engine failed to start")
                if state.on_fatal is not None:
                    state.on_fatal()

        task = asyncio.create_task(start())
        watch = asyncio.create_task(_watch_engine(state))
        try:
            yield
        finally:
            task.cancel()
            watch.cancel()
            if state.engine is not None:
                state.engine.shutdown()
            log.info("worker stopped: in-flight requests drained, engine shut down")

    # No /docs, /redoc or /openapi.json: the worker's API is internal (dynlogits.serve.protocol).
    app = FastAPI(title="dynlogits worker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    # A bug answers a JSON 500 and keeps the connection, so the frontend does not take this worker for dead.
    app.add_middleware(JsonErrors, server="worker", log=log)
    app.add_middleware(RequireWorkerSecret, secret=state.args.worker_secret)  # outermost: before anything runs

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the process serves (the engine may still be starting); 503 once its engine died.
        Open to anyone (liveness), so it says nothing more: why the engine died is on ``/ready``."""
        if state.engine_dead:
            return _error(503, "engine dead; the worker is exiting", kind="service_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if state.engine_dead:
            return _error(503, f"engine dead: {state.engine_dead}", kind="service_unavailable")
        if state.engine is None or state.policy is None:
            return _error(503, state.start_error or "engine starting", kind="service_unavailable")
        if state.draining:
            return _error(503, "worker is shutting down (draining in-flight requests)", kind="service_unavailable")
        try:
            await state.engine.engine.check_health()
        except Exception as err:  # noqa: BLE001
            return _error(503, f"engine unhealthy: {err}", kind="service_unavailable")
        return JSONResponse(state.info().model_dump())

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Counters, plus the adapter's per-request state and this worker's memory (see ``introspect``)."""
        engine = state.engine
        held = await adapter_requests(engine.engine) if engine is not None and engine.introspection else None
        rss = process_tree_rss()
        return state.stats.model_copy(update={"adapter_requests": held, "rss_bytes": sum(rss.values()) if rss else None,
                                              "rss_by_process": rss or None, "pid": os.getpid(),
                                              "protocol_errors": dict(state.protocol_errors.counts)}).model_dump()

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> JSONResponse | ClosingStreamingResponse:
        engine, policy = state.engine, state.policy
        if engine is None or policy is None or state.engine_dead:
            return _error(503, "worker engine is not ready" if not state.engine_dead
                          else f"engine dead: {state.engine_dead}", kind="service_unavailable")
        if state.draining:
            return _error(503, "worker is shutting down; send the request to another worker", kind="service_unavailable")
        try:  # the body is untrusted too: a frontend may be compromised, or misbehave
            req = GenerateRequest.model_validate(await read_json_body(request, max_bytes=MAX_GENERATE_BODY_BYTES,
                                                                      timeout_s=state.args.body_timeout_s))
        except ClientDisconnect:  # the body was cut short (or unparsable: the protocol answered 400)
            if not parser_refused(request.scope):
                state.protocol_errors.report("body_incomplete", "the connection ended before the request body arrived")
            return _error(499, "the connection ended before the request body arrived")
        except BodyError as err:
            return _error(err.status, err.message, param=err.param)
        except ValidationError as err:
            bad = first_error(err.errors())
            return _error(400, bad.message, param=bad.param)
        problem = generate_limit_problem(  # before anything is tokenized
            prompt=req.prompt, prompt_token_ids=req.prompt_token_ids, messages=req.messages, n=req.sampling.n,
            max_tokens=req.sampling.max_tokens, stop=req.sampling.stop, extra_args=req.extra_args,
            limits=state.args.request_limits)
        if problem is not None:
            return _error(400, problem.message, param=problem.param)
        cap = state.args.max_inflight_sequences
        if state.stats.in_flight_sequences + req.sampling.n > cap:
            state.stats.refused_capacity += 1
            return _error(429, f"this worker has {state.stats.in_flight_sequences} sequences in flight; "
                               f"{req.sampling.n} more would exceed {cap} (limit max_inflight_sequences); retry later",
                          kind="rate_limit_exceeded", headers={"Retry-After": "1"})
        try:  # logit_bias / allowed_token_ids / bad_words: kinds, under the same allow-list and limits
            controls = with_controls(req.logits_processors, req.controls(), state.config,
                                     encode=lambda text: engine.tokenizer.encode(text, add_special_tokens=False))
        except SpecError as err:
            return _error(400, str(err), param=err.problems[0].path)
        try:
            entries = policy.entries_for(controls.entries or None)
        except SpecError as err:
            renamed = rename_control_paths(err, controls.origins)
            return _error(400, str(renamed), param=renamed.problems[0].path)
        try:
            prompt_ids = engine.render_prompt(prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                                              messages=req.messages)
            params = engine.sampling_params(req.sampling, entries, req.extra_args)
        except EngineRequestError as err:
            return _error(400, str(err), param=err.param)
        if len(prompt_ids) >= engine.max_model_len:  # no room for one generated token
            field = "messages" if req.messages is not None else "prompt"
            return _error(400, f"{field}: the prompt is {len(prompt_ids)} tokens; this model's context is "
                               f"{engine.max_model_len} tokens, generation included", param=field)
        request_id = f"{req.request_id}-{next(state.ids)}"
        stream = engine.generate(prompt_ids, params, request_id)
        state.stats.requests += 1
        state.enter(req.sampling.n)
        try:
            first = await stream.__anext__()  # admission errors surface here, before any byte is sent
        except EngineRequestError as err:
            state.leave(req.sampling.n)
            return _error(400, str(err), param=err.param)
        except Exception as err:  # noqa: BLE001
            state.leave(req.sampling.n)
            log.exception("request %s failed", request_id)
            return _error(500, f"engine error: {type(err).__name__}: {err}", kind="internal_error")
        if entries:
            state.stats.activated += 1
        return _EngineStream(state, engine, request_id, req.sampling.n, first, stream)

    return app


class _EngineStream(ClosingStreamingResponse):
    """One engine request streamed as NDJSON.

    However the response ends (finished, client gone before the first byte, or mid-stream) the
    request leaves ``in_flight`` exactly once, and an engine request whose stream did not run to
    its end (client gone, or an error mid-stream) is aborted and counted in ``aborted``. An engine
    error after the first chunk is reported in-band, and so is ``end(reason)`` (the drain deadline):
    the engine request is aborted, its last outputs dropped, and ``reason`` sent as the error.
    """

    def __init__(self, state: WorkerState, engine: VllmEngine, request_id: str, sequences: int, first: GenerateChunk,
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
            self._abort = asyncio.create_task(self._engine.engine.abort(self._request_id))

    async def _ndjson(self, first: GenerateChunk) -> AsyncGenerator[bytes, None]:
        """When the engine is ahead of the client every await here completes without suspending,
        so the ``sleep(0)`` per chunk is what lets the event loop notice a disconnect (and answer
        health checks) before the request runs to its end."""
        try:
            yield first.model_dump_json(exclude_none=True).encode() + b"\n"
            async for chunk in self._stream:
                if self._ended is None:  # after end(): the engine's abort outputs, not the client's
                    yield chunk.model_dump_json(exclude_none=True).encode() + b"\n"
                await asyncio.sleep(0)
            self._finished = True
            if self._ended is not None:
                self._state.stats.drain_aborted += 1
                yield GenerateChunk(error=self._ended).model_dump_json(exclude_none=True).encode() + b"\n"
        except Exception as err:  # noqa: BLE001 - reported in-band, the stream already started
            log.exception("request %s failed mid-stream", self._request_id)
            yield GenerateChunk(error=f"{type(err).__name__}: {err}").model_dump_json(exclude_none=True).encode() + b"\n"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)  # closes the NDJSON body however it ends
        finally:
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
                if not self._finished:
                    self._state.stats.aborted += 1
                    await self._engine.engine.abort(self._request_id)
            self._state.leave(self._sequences)
            self._state.streams.discard(self)
