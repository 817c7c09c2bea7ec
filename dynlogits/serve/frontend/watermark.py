"""``POST /v1/watermark/detect``: is this text (or these token ids) watermarked with the operator's key?

read the body (``--max-body-bytes``, ``--body-timeout``) -> check it (``parse_detect_body``: one of
``text`` / ``token_ids``, bounded by ``max_prompt_chars``, 400 naming the field) -> 409 where the
operator's config has no watermark -> ask a generation worker (``POST /watermark/detect`` with the
worker secret; it tokenizes with the served model's tokenizer and runs the detector: see
``dynlogits.serve.watermark_detection`` for why there) -> its answer as it is. Behind the API keys like
every ``/v1/`` route (``ClientGuardMiddleware``). Counted as endpoint ``watermark_detect``. The key
never reaches this module: the worker holds it; nothing here quotes a config.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from dynlogits.policy.watermark_key import has_watermark
from dynlogits.serve.http.bodies import BodyError, read_json_body
from dynlogits.serve.http.connections import parser_refused
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.watermark_detection import DetectAnswer, no_watermark_error, parse_detect_body

from .client_guard import guard_of
from .completions import RETRY_AFTER_S
from .routing import NoWorkerError, WorkerError, WorkerTimeoutError
from .state import FrontendState

__all__ = ["ENDPOINT", "WORKER_PATH", "DetectCall"]

#: The metrics' ``endpoint`` label of this route.
ENDPOINT = "watermark_detect"
#: The worker's route that detects.
WORKER_PATH = "/watermark/detect"


class DetectCall:
    """One detection request; :meth:`answer` runs the steps and returns the response."""

    def __init__(self, state: FrontendState, request: Request) -> None:
        self.state, self.request = state, request
        self.guard = guard_of(request)
        self.started = time.perf_counter()

    async def answer(self) -> Response:
        metrics = self.state.metrics
        metrics.requests.labels(endpoint=ENDPOINT).inc()
        try:
            body = parse_detect_body(await self.read_body(), self.guard.request_limits)
            spec = self.state.config.spec
            if spec is None or not has_watermark(spec.entries):
                raise no_watermark_error()
            router = self.state.router
            worker, response = await router.open_stream(router.generation_pool, body.model_dump(exclude_none=True),
                                                        path=WORKER_PATH)
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            answer = DetectAnswer.model_validate(json.loads(content))
        except HTTPError as err:
            return self.failed(err)
        except ClientDisconnect:
            return Response(status_code=499)
        except NoWorkerError as err:
            return self.failed(HTTPError(503, str(err), kind="service_unavailable", retry_after_s=RETRY_AFTER_S))
        except WorkerTimeoutError as err:
            return self.failed(HTTPError(504, str(err), kind="worker_error", code="worker_timeout"))
        except WorkerError as err:  # relayed as the worker answered it (a 400 naming the field, its 409)
            metrics.errors.labels(endpoint=ENDPOINT, status=str(err.status)).inc()
            return Response(err.body, status_code=err.status, media_type="application/json")
        self.finished()
        return JSONResponse(answer.model_dump())

    async def read_body(self) -> Any:
        """The body's JSON within the size and time limits; ``ClientDisconnect`` when cut short."""
        try:
            return await read_json_body(self.request, max_bytes=self.state.max_body_bytes,
                                        timeout_s=self.guard.server.body_timeout_s)
        except ClientDisconnect:
            if not parser_refused(self.request.scope):
                self.guard.protocol_error("body_incomplete", "the connection ended before the request body arrived")
            raise
        except BodyError as err:
            if err.status == 408:
                self.guard.closed("body_timeout")
            raise HTTPError(err.status, err.message, param=err.param, code=err.code) from None

    def failed(self, err: HTTPError) -> JSONResponse:
        self.finished(err.status)
        return err.response()

    def finished(self, status: int | None = None) -> None:
        metrics = self.state.metrics
        if status is not None:
            metrics.errors.labels(endpoint=ENDPOINT, status=str(status)).inc()
        metrics.latency.labels(endpoint=ENDPOINT).observe(time.perf_counter() - self.started)
