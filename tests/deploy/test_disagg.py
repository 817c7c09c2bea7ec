"""``launch/disagg.sh``: prefill + decode workers; the visible output equals the aggregated one."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import SPEC_FILE, model_name, openai_client
from .launcher import PYTHON, ROOT, WORKER_AUTH, Deployment, free_port_block, settled_stats, wait_until
from .tcp_proxy import TcpProxy

pytestmark = pytest.mark.engine

PROMPTS = ["Hi", "Please write a short story about a cat who wanted to fly.", "What is 2 + 2?"]
TEXTS = ["Hello world!", "The answer is forty-two.", "Yes. No. Maybe."]


@pytest.fixture(scope="module")
def disagg() -> Iterator[Deployment]:
    d = Deployment("disagg", "disagg.sh", free_port_block(3), args=["--logits-spec", str(SPEC_FILE)],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    yield d
    d.stop()


def _answers(d: Deployment, stream: bool) -> list[str]:
    client, model, out = openai_client(d), model_name(d), []
    for prompt in PROMPTS:
        for text in TEXTS:
            kwargs: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                                      "extra_body": {"logits_processors": [{"kind": "forced_text", "text": text}]}}
            if stream:
                chunks = client.chat.completions.create(stream=True, **kwargs)
                out.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            else:
                out.append(client.chat.completions.create(**kwargs).choices[0].message.content)
    return out


def test_disagg_smoke(disagg: Deployment) -> None:
    reply = openai_client(disagg).chat.completions.create(
        model=model_name(disagg), messages=[{"role": "user", "content": "Hi"}],
        extra_body={"logits_processors": [{"kind": "forced_text", "text": "Hello world!"}]})
    assert reply.choices[0].message.content == "Hello world!"
    health = httpx.get(f"{disagg.url}/health", headers=WORKER_AUTH).json()
    assert sorted(w["role"] for w in health["workers"]) == ["decode", "prefill"]


@pytest.mark.parametrize("stream", [False, True])
def test_disagg_output_equals_agg(disagg: Deployment, spec_agg: Deployment, stream: bool) -> None:
    """The prefill worker's token never shifts a forced sequence: each answer is exactly the forced text."""
    agg, dis = _answers(spec_agg, stream), _answers(disagg, stream)
    assert dis == agg
    assert dis == TEXTS * len(PROMPTS)


def test_prefill_worker_never_activates_processors(disagg: Deployment) -> None:
    prefill = httpx.get(f"{disagg.worker_url(1)}/stats", headers=WORKER_AUTH).json()
    decode = httpx.get(f"{disagg.worker_url(2)}/stats", headers=WORKER_AUTH).json()
    assert prefill["requests"] >= 1 and prefill["activated"] == 0
    assert decode["activated"] == decode["requests"] >= 1
    info = httpx.get(f"{disagg.worker_url(1)}/ready", headers=WORKER_AUTH).json()
    assert info["role"] == "prefill" and not info["adapter_registered"] and info["deployment_kinds"] == []


def test_stats_of_a_worker_without_the_adapter_send_its_engine_no_call(disagg: Deployment) -> None:
    """A prefill worker has no adapter, so ``/stats`` reports no adapter state and does not ask its
    engine for one: the call raised in vLLM's model runner, an engine ERROR with a traceback in the
    log on every poll (the load tool polls ``/stats``)."""
    for _ in range(3):
        assert httpx.get(f"{disagg.worker_url(1)}/stats", headers=WORKER_AUTH).json()["adapter_requests"] is None
    assert settled_stats(disagg.worker_url(2))["adapter_requests"] == 0
    assert disagg.log_path is not None
    assert "has no attribute 'dynlogits_adapter_requests'" not in disagg.log_path.read_text(errors="replace")


def test_unforced_greedy_output_equals_agg(disagg: Deployment, spec_agg: Deployment) -> None:
    """Without a request spec (the deployment's pad ban still applies), greedy text matches too."""

    def greedy(d: Deployment) -> list[str | None]:
        client, model = openai_client(d), model_name(d)
        return [client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], max_tokens=12,
                                               temperature=0).choices[0].message.content for p in PROMPTS]

    agg = greedy(spec_agg)
    assert all(agg) and len(set(agg)) > 1
    assert greedy(disagg) == agg


def test_a_model_is_advertised_only_while_prefill_and_decode_are_both_ready(disagg: Deployment) -> None:
    """A second frontend reaches the real prefill and decode workers through ports the test opens
    and closes: ``/v1/models`` and ``/health`` say "serving" exactly when both roles are reachable,
    and a request never meets a 503 from a model that ``/v1/models`` listed."""
    port = free_port_block(3)
    proxies = {role: TcpProxy(port + 1 + i, disagg.port + 1 + i) for i, role in enumerate(("prefill", "decode"))}
    frontend = subprocess.Popen([PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port), "--logits-spec",
                                 str(SPEC_FILE), "--prefill-worker", f"http://127.0.0.1:{port + 1}",
                                 "--decode-worker", f"http://127.0.0.1:{port + 2}"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"

    def serving() -> tuple[int, list[str], int]:
        health = httpx.get(f"{url}/health", timeout=5).status_code
        models = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]]
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "dynlogits-tiny", "messages": [{"role": "user", "content": "Hi"}],
            "logits_processors": [{"kind": "forced_text", "text": "both ready"}]})
        if chat.status_code == 200:
            assert chat.json()["choices"][0]["message"]["content"] == "both ready"
        return health, models, chat.status_code

    def settles(expected: tuple[int, list[str], int]) -> bool:
        try:
            return serving() == expected
        except httpx.HTTPError:
            return False

    down, up = (503, [], 503), (200, ["dynlogits-tiny"], 200)
    try:
        wait_until(lambda: settles(down), 60, "the frontend with no worker reachable")
        proxies["prefill"].open()
        time.sleep(3)  # several readiness probes: the prefill worker alone must not make it serve
        assert serving() == down
        proxies["decode"].open()
        wait_until(lambda: settles(up), 60, "both roles ready")
        proxies["prefill"].close()
        wait_until(lambda: settles(down), 60, "the frontend to withdraw the model")
        assert serving() == down  # decode alone does not serve either
    finally:
        frontend.terminate()
        frontend.wait(timeout=30)
        for proxy in proxies.values():
            proxy.shutdown()


def test_disagg_stops_every_child(disagg: Deployment) -> None:
    assert disagg.stop(signal.SIGTERM) == []
