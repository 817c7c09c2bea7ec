"""``launch/disagg.sh``: prefill + decode workers; the visible output equals the aggregated one."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import SPEC_FILE, model_name, openai_client
from .launcher import Deployment, free_port_block

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
    health = httpx.get(f"{disagg.url}/health").json()
    assert sorted(w["role"] for w in health["workers"]) == ["decode", "prefill"]


@pytest.mark.parametrize("stream", [False, True])
def test_disagg_output_equals_agg(disagg: Deployment, spec_agg: Deployment, stream: bool) -> None:
    """The prefill worker's token never shifts a forced sequence: each answer is exactly the forced text."""
    agg, dis = _answers(spec_agg, stream), _answers(disagg, stream)
    assert dis == agg
    assert dis == TEXTS * len(PROMPTS)


def test_prefill_worker_never_activates_processors(disagg: Deployment) -> None:
    prefill = httpx.get(f"{disagg.worker_url(1)}/stats").json()
    decode = httpx.get(f"{disagg.worker_url(2)}/stats").json()
    assert prefill["requests"] >= 1 and prefill["activated"] == 0
    assert decode["activated"] == decode["requests"] >= 1
    info = httpx.get(f"{disagg.worker_url(1)}/ready").json()
    assert info["role"] == "prefill" and not info["adapter_registered"] and info["deployment_kinds"] == []


def test_unforced_greedy_output_equals_agg(disagg: Deployment, spec_agg: Deployment) -> None:
    """Without a request spec (the deployment's pad ban still applies), greedy text matches too."""

    def greedy(d: Deployment) -> list[str | None]:
        client, model = openai_client(d), model_name(d)
        return [client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], max_tokens=12,
                                               temperature=0).choices[0].message.content for p in PROMPTS]

    agg = greedy(spec_agg)
    assert all(agg) and len(set(agg)) > 1
    assert greedy(disagg) == agg


def test_disagg_stops_every_child(disagg: Deployment) -> None:
    assert disagg.stop(signal.SIGTERM) == []
