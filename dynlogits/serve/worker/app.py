"""The worker's HTTP app: ``/generate`` (``.generate``, an NDJSON stream), ``/watermark/detect``
(``.watermark``), ``/health``, ``/ready``, ``/stats``.

Every route but ``/health`` (liveness) needs the deployment's worker secret when one is set
(``dynlogits.serve.secret``); ``/generate`` keeps its own bound on the sequences in flight
(``--max-inflight-sequences``), whoever calls it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dynlogits.serve.http.asgi_errors import JsonErrors
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.secret import RequireWorkerSecret

from .engine_life import ENGINE_DEAD_EXIT, engine_lifespan
from .engine_stream import EngineStream
from .generate import GenerateCall
from .introspect import process_tree_rss
from .state import WorkerState
from .watermark import detect_route

__all__ = ["ENGINE_DEAD_EXIT", "WorkerState", "create_app"]

log = logging.getLogger("dynlogits.serve.worker")


def _unavailable(message: str) -> JSONResponse:
    return HTTPError(503, message, kind="service_unavailable").response()


class WorkerRoutes:
    """The handlers of one worker app, bound to its :class:`WorkerState`."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    async def health(self) -> JSONResponse:
        """200 while the process serves (the engine may still be starting); 503 once its engine died.
        Open to anyone (liveness), so it says nothing more: why the engine died is on ``/ready``."""
        if self.state.engine_dead:
            return _unavailable("engine dead; the worker is exiting")
        return JSONResponse({"status": "ok"})

    async def ready(self) -> JSONResponse:
        """200 with :class:`~dynlogits.serve.protocol.WorkerInfo` while the engine serves; 503 saying
        why not (starting, failed to start, dead, draining, unhealthy)."""
        state = self.state
        if state.engine_dead:
            return _unavailable(f"engine dead: {state.engine_dead}")
        if state.engine is None or state.policy is None:
            return _unavailable(state.start_error or "engine starting")
        if state.draining:
            return _unavailable("worker is shutting down (draining in-flight requests)")
        try:
            await state.engine.check_health()
        except Exception as err:  # noqa: BLE001
            return _unavailable(f"engine unhealthy: {err}")
        return JSONResponse(state.info().model_dump())

    async def stats(self) -> dict[str, Any]:
        """Counters, plus the adapter's per-request state and this worker's memory (see ``introspect``)."""
        state = self.state
        engine = state.engine
        held = await engine.adapter_requests() if engine is not None else None
        rss = process_tree_rss()
        return state.stats.model_copy(update={"adapter_requests": held, "rss_bytes": sum(rss.values()) if rss else None,
                                              "rss_by_process": rss or None, "pid": os.getpid(),
                                              "protocol_errors": dict(state.protocol_errors.counts)}).model_dump()

    async def generate(self, request: Request) -> JSONResponse | EngineStream:
        return await GenerateCall(self.state, request).answer()

    async def watermark_detect(self, request: Request) -> JSONResponse:
        return await detect_route(self.state, request)


def create_app(state: WorkerState) -> FastAPI:
    """The worker app; the engine starts in a thread at start-up so ``/health`` answers meanwhile."""
    # No /docs, /redoc or /openapi.json: the worker's API is internal (dynlogits.serve.protocol).
    app = FastAPI(title="dynlogits worker", lifespan=engine_lifespan(state), docs_url=None, redoc_url=None,
                  openapi_url=None)
    # A bug answers a JSON 500 and keeps the connection, so the frontend does not take this worker for dead.
    app.add_middleware(JsonErrors, server="worker", log=log)
    app.add_middleware(RequireWorkerSecret, secret=state.args.worker_secret)  # outermost: before anything runs
    routes = WorkerRoutes(state)
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/ready", routes.ready, methods=["GET"])
    app.add_api_route("/stats", routes.stats, methods=["GET"])
    app.add_api_route("/generate", routes.generate, methods=["POST"], response_model=None)
    app.add_api_route("/watermark/detect", routes.watermark_detect, methods=["POST"])
    return app
