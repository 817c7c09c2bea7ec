"""Frontend behaviour that needs no engine: imports, no-worker 503s, CLI errors (real processes, real HTTP)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest

from .launcher import PYTHON, ROOT, WORKER_AUTH, free_port_block, wait_until


def test_frontend_imports_no_torch_and_no_engine() -> None:
    code = ("import sys, dynlogits.serve.frontend.__main__, dynlogits.serve.frontend.app, dynlogits.serve.protocol; "
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([PYTHON, "-c", code], check=True, cwd=ROOT, timeout=60)


@pytest.fixture(scope="module")
def lonely_frontend() -> Iterator[str]:
    """A frontend whose only worker never comes up."""
    port = free_port_block(2)
    proc = subprocess.Popen([PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port),
                             "--agg-worker", f"http://127.0.0.1:{port + 1}"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 30, "the frontend")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_no_worker_gives_503_with_a_clear_message(lonely_frontend: str) -> None:
    client = openai.OpenAI(base_url=f"{lonely_frontend}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503
    assert "no worker is ready" in err.value.message
    health = httpx.get(f"{lonely_frontend}/health")  # the public view: each worker's role and readiness only
    assert health.status_code == 503 and health.json()["workers"] == [{"role": "agg", "ready": False}]
    detailed = httpx.get(f"{lonely_frontend}/health", headers=WORKER_AUTH)  # the operator's: URL and probe error
    assert detailed.status_code == 503 and "unreachable" in detailed.json()["workers"][0]["error"]
    assert client.models.list().data == []


def test_request_validation_runs_before_routing(lonely_frontend: str) -> None:
    r = httpx.post(f"{lonely_frontend}/v1/chat/completions", json={
        "model": "any", "messages": [{"role": "user", "content": "hi"}],
        "logits_processors": [{"kind": "banned_tokens", "token_ids": [1, -3]}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "logits_processors[0].token_ids[1]"


def test_bad_config_is_refused_at_start() -> None:
    r = subprocess.run([PYTHON, "-m", "dynlogits.serve.frontend", "--agg-worker", "http://127.0.0.1:1",
                        "--allow-request-kinds", "python"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "allow_request_kinds[0]" in r.stderr


def test_worker_set_must_be_complete() -> None:
    r = subprocess.run([PYTHON, "-m", "dynlogits.serve.frontend", "--prefill-worker", "http://127.0.0.1:1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--decode-worker" in r.stderr


@pytest.mark.parametrize("script", ["agg.sh", "disagg.sh"])
def test_launch_refuses_a_busy_port_before_starting_anything(lonely_frontend: str, script: str) -> None:
    busy = int(lonely_frontend.rsplit(":", 1)[1])
    r = subprocess.run([str(ROOT / "launch" / script), "--port", str(busy)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert f"port {busy} on 127.0.0.1 is already in use" in r.stderr
    assert "started" not in r.stderr
