"""The frontend's OpenAI-compatible app: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``
(``.completions``), ``/v1/watermark/detect`` (``.watermark``), ``/health`` and ``/metrics``; the worker router probes from start-up to shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from dynlogits.serve.http.asgi_errors import JsonErrors
from dynlogits.serve.secret import presents_secret

from .completions import CompletionCall
from .state import FrontendState
from .watermark import DetectCall

__all__ = ["FrontendState", "create_app"]

log = logging.getLogger("dynlogits.serve.frontend")



class FrontendRoutes:
    """The handlers of one frontend app, bound to its :class:`FrontendState`."""

    def __init__(self, state: FrontendState) -> None:
        self.state = state

    async def health(self, request: Request) -> JSONResponse:
        """200 when a request can be served, else 503; each worker's role and readiness. Its URL and
        the last probe's error only for a caller presenting the worker secret (the operator)."""
        router = self.state.router
        detailed = presents_secret(request.scope, self.state.worker_secret)
        workers = [{"url": e.url, "role": e.role, "ready": e.ready, "error": e.last_error} if detailed
                   else {"role": e.role, "ready": e.ready} for e in router.all_endpoints()]
        ok = router.ready()
        return JSONResponse({"status": "ok" if ok else "unavailable", "workers": workers}, status_code=200 if ok else 503)

    async def metrics(self) -> Response:
        """The Prometheus metrics, with the ready workers per role counted now."""
        metrics = self.state.metrics
        for role, pool in self.state.router.pools.items():
            metrics.workers_ready.labels(role=role).set(sum(e.ready for e in pool.endpoints))
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def models(self) -> dict[str, Any]:
        """The models every role has a ready worker for."""
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "dynlogits"}
                                           for m in self.state.router.model_names()]}

    async def chat_completions(self, request: Request) -> Response:
        return await CompletionCall(self.state, "chat", request).answer()

    async def completions(self, request: Request) -> Response:
        return await CompletionCall(self.state, "completion", request).answer()

    async def watermark_detect(self, request: Request) -> Response:
        return await DetectCall(self.state, request).answer()


def create_app(state: FrontendState) -> FastAPI:
    """The app; its lifespan probes every worker once, then keeps probing until shutdown."""
    router = state.router

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
    routes = FrontendRoutes(state)
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    app.add_api_route("/v1/models", routes.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_api_route("/v1/watermark/detect", routes.watermark_detect, methods=["POST"])
    return app
