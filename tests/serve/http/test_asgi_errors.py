"""``JsonErrors``: a bug in a route answers a JSON 500 and the exception stays inside the app."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from dynlogits.serve.http.asgi_errors import JsonErrors


def _app(with_middleware: bool) -> FastAPI:
    app = FastAPI()
    if with_middleware:
        app.add_middleware(JsonErrors, server="worker", log=logging.getLogger("test"))

    @app.get("/boom")
    async def boom() -> None:
        raise KeyError("bug")

    @app.get("/fine")
    async def fine() -> dict[str, bool]:
        return {"ok": True}

    return app


def test_a_bug_answers_a_json_500_without_the_exception_leaving_the_app() -> None:
    # TestClient re-raises what escapes the app (uvicorn would close the connection).
    with TestClient(_app(True)) as client:
        r = client.get("/boom")
        assert r.status_code == 500
        assert r.json()["error"] == {"message": "internal error in the worker: KeyError", "type": "internal_error",
                                     "param": None, "code": None}
        assert client.get("/fine").json() == {"ok": True}


def test_without_it_the_exception_escapes() -> None:
    with TestClient(_app(False)) as client:
        with pytest.raises(KeyError):
            client.get("/boom")
