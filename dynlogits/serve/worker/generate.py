"""``POST /generate``: one request through the worker's steps.

check the engine serves -> read and validate the body (the worker's own trust boundary: its port is
reachable, whoever the caller) -> per-request limits, before anything is tokenized -> the worker's
in-flight bound -> the request's entries (its controls mapped onto kinds, then the request policy's
one parse and the role gate, on the admission thread) -> the engine's prompt and params -> start
the engine request, whose admission errors surface before any byte is sent -> an
:class:`EngineStream` (NDJSON).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from dynlogits.policy.request import REQUEST_ROOT, RequestPolicy
from dynlogits.policy.watermark_key import has_watermark
from dynlogits.serve.http.bodies import DEFAULT_MAX_BODY_BYTES, BodyError, first_error, read_json_body
from dynlogits.serve.http.connections import parser_refused
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.limits import generate_limit_problem
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, WireEntry
from dynlogits.specs.prompt_limit import prompt_limit_problem

from ..protocol import GenerateRequest
from .engine_stream import EngineStream
from .state import WorkerState
from .worker_engine import EngineRequestError, ParamsT, WorkerEngine

__all__ = ["MAX_GENERATE_BODY_BYTES", "GenerateCall"]

log = logging.getLogger("dynlogits.serve.worker")

#: The frontend re-encodes a client body (escapes may grow it); the worker's own bound is looser.
MAX_GENERATE_BODY_BYTES = 4 * DEFAULT_MAX_BODY_BYTES


class GenerateCall:
    """One ``/generate`` request; :meth:`answer` runs the steps and returns the response."""

    def __init__(self, state: WorkerState, request: Request) -> None:
        self.state, self.request = state, request
        #: when the request reached this worker: the arrival entries count from (``specs.ARRIVAL_KEY``)
        self.arrival_time = time.time()
        #: how many of the activated entries are the client's own (they come last)
        self.requested = 0
        #: where each of the client's own entries came from (``None``: ``logits_processors``; else a control field)
        self.origins: list[str | None] = []
        #: whether the deployment's watermark was moved after the client's entries (``deployment_watermark_last``)
        self.watermark_last = False

    async def answer(self) -> JSONResponse | EngineStream:
        """The NDJSON stream, or an error answer naming the field (4xx) or the engine's failure."""
        try:
            engine, policy = self.serving()
            req = await self.read_request()
            self.check_limits(req)
            self.check_capacity(req)
            entries = await self.admit(req, policy)
            prompt_ids, params = self.engine_request(req, engine, entries)
            return await self.start(req, engine, prompt_ids, params, entries)
        except HTTPError as err:
            return err.response()

    def serving(self) -> tuple[WorkerEngine[Any], RequestPolicy]:
        """The engine and policy; 503 while the engine starts, once it died, or while draining."""
        state = self.state
        engine, policy = state.engine, state.policy
        if engine is None or policy is None or state.engine_dead:
            raise HTTPError(503, "worker engine is not ready" if not state.engine_dead
                            else f"engine dead: {state.engine_dead}", kind="service_unavailable")
        if state.draining:
            raise HTTPError(503, "worker is shutting down; send the request to another worker",
                            kind="service_unavailable")
        return engine, policy

    async def read_request(self) -> GenerateRequest:
        """The body, read like a client's (a frontend may be compromised, or misbehave) and validated;
        499 when it was cut short, else a 4xx naming what is wrong."""
        state, request = self.state, self.request
        try:
            return GenerateRequest.model_validate(await read_json_body(request, max_bytes=MAX_GENERATE_BODY_BYTES,
                                                                       timeout_s=state.args.body_timeout_s))
        except ClientDisconnect:  # the body was cut short (or unparsable: the protocol answered 400)
            if not parser_refused(request.scope):
                state.protocol_errors.report("body_incomplete", "the connection ended before the request body arrived")
            raise HTTPError(499, "the connection ended before the request body arrived") from None
        except BodyError as err:
            raise HTTPError(err.status, err.message, param=err.param) from None
        except ValidationError as err:
            bad = first_error(err.errors())
            raise HTTPError(400, bad.message, param=bad.param) from None

    def check_limits(self, req: GenerateRequest) -> None:
        """400 for a request over a per-request limit (``dynlogits.serve.limits``), before any tokenizing."""
        problem = generate_limit_problem(
            prompt=req.prompt, prompt_token_ids=req.prompt_token_ids, messages=req.messages, n=req.sampling.n,
            max_tokens=req.sampling.max_tokens, stop=req.sampling.stop, extra_args=req.extra_args,
            limits=self.state.args.request_limits)
        if problem is not None:
            raise HTTPError(400, problem.message, param=problem.param)

    def check_capacity(self, req: GenerateRequest) -> None:
        """429 (counted) when the request's sequences would exceed this worker's in-flight bound."""
        stats, cap = self.state.stats, self.state.args.max_inflight_sequences
        if stats.in_flight_sequences + req.sampling.n > cap:
            stats.refused_capacity += 1
            raise HTTPError(429, f"this worker has {stats.in_flight_sequences} sequences in flight; "
                                 f"{req.sampling.n} more would exceed {cap} (limit max_inflight_sequences); retry later",
                            kind="rate_limit_exceeded", retry_after_s=1)

    async def admit(self, req: GenerateRequest, policy: RequestPolicy) -> list[WireEntry]:
        """:meth:`entries` on the worker's admission thread (``WorkerState.admission``), never on the
        event loop: text resolution and the consistency walks (bounded by the admission work budget,
        ``limits.max_admission_work``) delay other admissions at most, never streams or health checks."""
        return await asyncio.get_running_loop().run_in_executor(self.state.admission, self.entries, req, policy)

    def entries(self, req: GenerateRequest, policy: RequestPolicy) -> list[WireEntry]:
        """The wire entries this request activates: ``logit_bias`` / ``allowed_token_ids`` /
        ``bad_words`` mapped onto kinds under the same allow-list and limits, then every entry
        validated once by the request policy and gated by role. 400 naming the field."""
        try:
            controls = with_controls(req.logits_processors, req.controls(), self.state.config)
        except SpecError as err:
            raise HTTPError(400, str(err), param=err.problems[0].path) from None
        try:
            entries = policy.entries_for(controls.entries or None, ignore_eos=req.sampling.ignore_eos)
            self.requested = len(controls.entries) if policy.generates else 0
            self.origins = list(controls.origins)
            self.watermark_last = bool(self.requested) and policy.deployment is not None and has_watermark(
                policy.deployment.entries)
            return entries
        except SpecError as err:
            renamed = rename_control_paths(err, controls.origins)
            raise HTTPError(400, str(renamed), param=renamed.problems[0].path) from None

    def engine_request(self, req: GenerateRequest, engine: WorkerEngine[ParamsT],
                       entries: list[WireEntry]) -> tuple[list[int], ParamsT]:
        """The prompt's token ids and the engine's sampling params with ``entries`` activated (and the
        request's arrival beside them); 400 when the engine refuses them, the prompt leaves no room for
        one generated token, or it is longer than an entry reading it may read (``max_prompt_tokens``)."""
        try:
            prompt_ids = engine.render_prompt(prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                                              messages=req.messages)
            params = engine.sampling_params(req.sampling, entries, req.extra_args, arrival_time=self.arrival_time)
        except EngineRequestError as err:
            raise HTTPError(400, str(err), param=err.param) from None
        field = "messages" if req.messages is not None else "prompt"
        if len(prompt_ids) >= engine.max_model_len:
            raise HTTPError(400, f"{field}: the prompt is {len(prompt_ids)} tokens; this model's context is "
                                 f"{engine.max_model_len} tokens, generation included", param=field)
        paths = self.payload_paths(len(entries), [f"{REQUEST_ROOT}[{j}]" for j in range(self.requested)])
        problem = prompt_limit_problem(entries, len(prompt_ids), self.state.config.limits, path=field, paths=paths)
        if problem is not None:
            raise HTTPError(400, str(problem), param=field)
        return prompt_ids, params

    async def start(self, req: GenerateRequest, engine: WorkerEngine[ParamsT], prompt_ids: list[int], params: ParamsT,
                    entries: list[WireEntry]) -> EngineStream:
        """Start the engine request and wait for its first chunk, so that the engine's admission errors
        (a 400 naming the field) and failures (500) are answered before any byte is sent. A failure of
        its entries while it generates names the entry as the client knows it (``entry_paths``)."""
        state, n = self.state, req.sampling.n
        request_id = f"{req.request_id}-{next(state.ids)}"
        stream = engine.generate(prompt_ids, params, request_id, entry_paths=self.entry_paths(entries),
                                 entry_kinds=[e.kind for e in entries])
        state.stats.requests += 1
        state.enter(n)
        try:
            first = await stream.__anext__()
        except EngineRequestError as err:
            state.leave(n)
            raise HTTPError(400, str(err), param=err.param) from None
        except Exception as err:  # noqa: BLE001
            state.leave(n)
            log.exception("request %s failed", request_id)
            raise HTTPError(500, f"engine error: {type(err).__name__}: {err}", kind="internal_error") from None
        if entries:
            state.stats.activated += 1
        return EngineStream(state, engine, request_id, n, first, stream)

    def entry_paths(self, entries: list[WireEntry]) -> list[str]:
        """Each activated entry's path as the client knows it: the deployment's first
        (``deployment entries[i]``), then the client's own (``logits_processors[j]``, or the control
        field it came from: ``logit_bias``, ``allowed_token_ids``, ``bad_words``)."""
        origins = self.origins
        own = [(origins[j] if j < len(origins) else None) or f"{REQUEST_ROOT}[{j}]" for j in range(self.requested)]
        return self.payload_paths(len(entries), own)

    def payload_paths(self, count: int, own: list[str]) -> list[str]:
        """The paths of a payload of ``count`` entries whose last ``len(own)`` are the client's (named
        ``own``), but for the deployment's watermark, which comes after them (``watermark_last``)."""
        deployment = count - len(own)
        paths = [f"deployment entries[{i}]" for i in range(deployment)]
        if self.watermark_last:
            return paths[:-1] + own + paths[-1:]
        return paths + own
