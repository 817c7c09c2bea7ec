"""``POST /watermark/detect``: the worker's side of the frontend's ``/v1/watermark/detect``.

check the engine serves (503 otherwise, so the frontend tries another worker) -> 409 where the
operator's config has no watermark -> read and check the body as the frontend does (the worker's own
trust boundary) -> on a thread, never the event loop: ``text`` tokenized with the engine's tokenizer
(no special tokens), every id checked against the logits width (400 naming ``token_ids[i]``), and
the detector run with the operator's key and context width -> :class:`DetectAnswer`.

The key comes from the operator's config as loaded at start-up (``key``, ``key_env`` or ``key_file``:
``dynlogits.policy.watermark_key``) and goes nowhere but the detector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio.to_thread
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from dynlogits.policy.watermark_key import OperatorWatermark, operator_watermark
from dynlogits.serve.http.bodies import BodyError, read_json_body
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.watermark_detection import DetectAnswer, DetectRequest, no_watermark_error, parse_detect_body

from .generate import MAX_GENERATE_BODY_BYTES
from .state import WorkerState
from .worker_engine import WorkerEngine

__all__ = ["detect_answer", "detect_route"]


async def detect_route(state: WorkerState, request: Request) -> JSONResponse:
    """The answer to one detection request, or its error (4xx naming the field, 409, 503)."""
    try:
        engine = state.engine
        if engine is None or state.policy is None or state.engine_dead:
            raise HTTPError(503, "worker engine is not ready", kind="service_unavailable")
        watermark = operator_watermark(state.config.spec.entries) if state.config.spec is not None else None
        if watermark is None:
            raise no_watermark_error()
        try:
            data = await read_json_body(request, max_bytes=MAX_GENERATE_BODY_BYTES, timeout_s=state.args.body_timeout_s)
        except ClientDisconnect:
            raise HTTPError(499, "the connection ended before the request body arrived") from None
        except BodyError as err:
            raise HTTPError(err.status, err.message, param=err.param) from None
        body = parse_detect_body(data, state.args.request_limits)
        answer = await anyio.to_thread.run_sync(detect_answer, body, engine, watermark)
    except HTTPError as err:
        return err.response()
    return JSONResponse(answer.model_dump())


def _token_ids(body: DetectRequest, engine: WorkerEngine[Any]) -> Sequence[int]:
    """The ids to score: ``token_ids`` as sent, or ``text`` tokenized as the engine's tokenizer does,
    without special tokens; 400 naming an id beyond the logits width."""
    if body.text is not None:
        return list(engine.tokenizer.encode(body.text, add_special_tokens=False))
    ids = body.token_ids or []
    width = engine.vocab_size
    for i, tid in enumerate(ids):
        if tid >= width:
            raise HTTPError(400, f"token_ids[{i}]: must be below the model's logits width {width}",
                            param=f"token_ids[{i}]")
    return ids


def detect_answer(body: DetectRequest, engine: WorkerEngine[Any], watermark: OperatorWatermark) -> DetectAnswer:
    """Detection of ``body``'s ids with ``watermark``'s key and context width (runs the detector: torch)."""
    from dynlogits.processors.watermark_detect import detect  # torch: only where detection runs

    ids = _token_ids(body, engine)
    try:
        found = detect(list(ids), key=watermark.key, context_width=watermark.context_width,
                       vocab_size=engine.vocab_size)
    except ValueError as err:  # the detector's own bounds (its message names the argument, never the key)
        param = "text" if body.text is not None else str(err).split(":", 1)[0]
        raise HTTPError(400, f"{param}: {str(err).split(': ', 1)[-1]}", param=param) from None
    return DetectAnswer.of(found)
