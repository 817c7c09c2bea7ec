"""A frontend with two real agg workers: load is spread across both; SIGTERM drains; a dead one is skipped.

The first worker is ``spec_agg``'s; the second is started here on its own engine. A separate
frontend process routes to both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from .conftest import SPEC_FILE, openai_client
from .launcher import ENGINE_FLAGS, LOG_DIR, PYTHON, ROOT, WORKER_AUTH, Deployment, free_port_block, wait_until

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Route me."}]


def _start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / f"{name}.log", "wb") as log:
        return subprocess.Popen([PYTHON, "-m", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"},
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def two_workers(spec_agg: Deployment) -> Iterator[tuple[Deployment, list[str], subprocess.Popen[bytes]]]:
    port = free_port_block(2)
    first, second = spec_agg.worker_url(1), f"http://127.0.0.1:{port + 1}"
    worker = _start("routing-second-worker", ["dynlogits.serve.worker", "--port", str(port + 1), "--logits-spec",
                                              str(SPEC_FILE), "--graceful-timeout", "120", *ENGINE_FLAGS])
    frontend = _start("routing-frontend", ["dynlogits.serve.frontend", "--port", str(port), "--agg-worker",
                                           f"{first},{second}", "--logits-spec", str(SPEC_FILE)])
    front = Deployment("routing", "agg.sh", port)  # only its URLs are used; the processes are ours
    try:
        def both_ready() -> bool:
            try:
                health = httpx.get(f"{front.url}/health", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return False
            return [w["ready"] for w in health["workers"]] == [True, True]

        wait_until(both_ready, 300, "both workers ready behind the routing frontend")
        yield front, [first, second], worker
    finally:
        _stop(frontend)
        _stop(worker)


def _served(urls: list[str]) -> list[int]:
    return [httpx.get(f"{u}/stats", headers=WORKER_AUTH).json()["requests"] for u in urls]


def test_requests_are_spread_across_workers(two_workers) -> None:
    front, urls, _ = two_workers
    client = openai_client(front)
    before = _served(urls)
    for i in range(6):
        text = f"worker turn {i}"
        reply = client.chat.completions.create(model="dynlogits-tiny", messages=MESSAGES,
                                               extra_body={"logits_processors": [{"kind": "forced_text", "text": text}]})
        assert reply.choices[0].message.content == text
    after = _served(urls)
    assert [a - b for a, b in zip(after, before)] == [3, 3]


def test_sigterm_lets_the_in_flight_request_finish(two_workers) -> None:
    """SIGTERM to the worker process alone (as an orchestrator sends it): the streaming request
    it is serving runs to its end, then the worker and its engine exit cleanly."""
    _, urls, worker = two_workers
    body = {"request_id": "graceful", "prompt": "Hi", "sampling": {"max_tokens": 400, "ignore_eos": True,
                                                                    "temperature": 0}}
    with httpx.stream("POST", f"{urls[1]}/generate", json=body, timeout=120, headers=WORKER_AUTH) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = json.loads(next(lines))
        worker.send_signal(signal.SIGTERM)
        chunks = [first, *(json.loads(line) for line in lines if line)]
    assert chunks[-1]["usage"]["completion_tokens"] == 400
    assert any(c.get("finish_reason") == "length" for c in chunks)
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete, hence -SIGTERM.
    assert worker.wait(timeout=120) == -signal.SIGTERM
    log = (LOG_DIR / "routing-second-worker.log").read_text()
    assert "worker stopped: in-flight requests drained, engine shut down" in log


def test_a_dead_worker_is_skipped(two_workers) -> None:
    front, urls, worker = two_workers
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    client = openai_client(front)
    before = _served(urls[:1])
    for _ in range(3):  # the first may still pick the dead one: it is marked down and the next is tried
        reply = client.chat.completions.create(model="dynlogits-tiny", messages=MESSAGES,
                                               extra_body={"logits_processors": [{"kind": "forced_text", "text": "alive"}]})
        assert reply.choices[0].message.content == "alive"
    assert _served(urls[:1])[0] - before[0] == 3
    health = httpx.get(f"{front.url}/health").json()
    assert [w["ready"] for w in health["workers"]] == [True, False]
