"""The worker port is for the deployment's frontend only (``dynlogits.serve.secret``): every route but
``/health`` answers 401 without the deployment's secret, the frontend's router sends it on every call,
and a worker refuses to listen beyond this machine without one.

Real HTTP (uvicorn in a thread, the frontend's real ``Router``); the worker's own app on a real engine
is in ``tests/deploy/test_surface.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from deploy.launcher import PYTHON, ROOT
from fastapi import FastAPI
from threaded_uvicorn import ThreadedServer

from dynlogits.serve.frontend.routing import Router
from dynlogits.serve.secret import RequireWorkerSecret, load_worker_secret

SECRET = "s3cret-for-this-deployment-only"
INFO = {"model": "m", "role": "agg", "backend": "vllm", "max_model_len": 64, "vocab_size": 32}


def _worker_like(secret: str | None) -> Any:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return INFO

    @app.post("/generate")
    async def generate() -> dict[str, str]:
        return {"generated": "yes"}

    app.add_middleware(RequireWorkerSecret, secret=secret)
    return app


@pytest.fixture(scope="module")
def worker() -> Any:
    with ThreadedServer(_worker_like(SECRET)) as server:
        yield f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {SECRET}"},
                                     {"Authorization": f"Bearer {SECRET}x"}], ids=["none", "wrong", "basic", "longer"])
def test_every_route_but_liveness_needs_the_secret(worker: str, headers: dict[str, str]) -> None:
    for method, path in (("GET", "/ready"), ("POST", "/generate"), ("GET", "/stats"), ("GET", "/anything")):
        r = httpx.request(method, worker + path, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_worker_secret", (path, r.text)
    assert httpx.get(worker + "/health", headers=headers, timeout=10).json() == {"status": "ok"}


def test_the_secret_opens_every_route(worker: str) -> None:
    auth = {"Authorization": f"Bearer {SECRET}"}
    assert httpx.get(worker + "/ready", headers=auth, timeout=10).json() == INFO
    assert httpx.post(worker + "/generate", headers=auth, timeout=10).json() == {"generated": "yes"}


def test_without_a_secret_set_every_route_is_open() -> None:
    with ThreadedServer(_worker_like(None)) as server:
        assert httpx.get(f"http://127.0.0.1:{server.port}/ready", timeout=10).status_code == 200


def test_the_router_sends_the_secret_and_says_when_a_worker_refuses_it(worker: str) -> None:
    async def probe(secret: str | None) -> tuple[bool, str | None]:
        router = Router({"agg": [worker]}, worker_secret=secret)
        try:
            await router.probe_all()
            endpoint = router.all_endpoints()[0]
            return endpoint.ready, endpoint.last_error
        finally:
            await router.close()

    assert asyncio.run(probe(SECRET)) == (True, None)
    ready, error = asyncio.run(probe("another-deployments-secret"))
    assert not ready and error is not None and "DYN_WORKER_SECRET" in error


def test_the_secret_comes_from_a_file_or_the_environment_and_is_long_enough(tmp_path: Path) -> None:
    assert load_worker_secret(None, {}) is None
    assert load_worker_secret(None, {"DYN_WORKER_SECRET": f" {SECRET} "}) == SECRET
    (tmp_path / "secret").write_text(f"# the worker secret\n{SECRET}\n")
    assert load_worker_secret(str(tmp_path / "secret"), {"DYN_WORKER_SECRET": "ignored-when-a-file-is-given"}) == SECRET
    with pytest.raises(ValueError, match="DYN_WORKER_SECRET: the worker secret must be at least 16"):
        load_worker_secret(None, {"DYN_WORKER_SECRET": "short"})
    with pytest.raises(ValueError, match="cannot be read"):
        load_worker_secret(str(tmp_path / "missing"), {})


@pytest.mark.parametrize(("env", "args", "message"), [
    ({}, ["--host", "0.0.0.0"], "--host 0.0.0.0 exposes the worker beyond this machine"),
    ({"DYN_WORKER_SECRET": "short"}, [], "the worker secret must be at least 16 characters"),
])
def test_the_worker_refuses_to_start_exposed_or_with_a_weak_secret(env: dict[str, str], args: list[str],
                                                                   message: str) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "DYN_WORKER_SECRET"}
    r = subprocess.run([PYTHON, "-m", "dynlogits.serve.worker", *args], cwd=ROOT, env={**environ, **env},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
