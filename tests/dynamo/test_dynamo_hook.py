"""``DYN_ENABLE_TEST_LOGITS_PROCESSOR=1 ./launch/agg.sh --runtime dynamo --workers 2``: the real
NVIDIA Dynamo frontend (``python -m dynamo.frontend``) spreads requests over two real
``python -m dynamo.vllm`` workers, and both answer "Hello world!" through the adapter's engine-side
spec source. Driven with the real ``openai`` client and Dynamo's token-level route.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest
from dynamo_helpers import HELLO, MODEL, Deployment, dynamo_deployment, generate_tokens, openai_client

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "What do you say?"}]


@pytest.fixture(scope="module")
def hook_dynamo() -> Iterator[Deployment]:
    d = dynamo_deployment("dynamo-hook", workers=2, env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "1"})
    yield d
    left = d.stop(signal.SIGTERM)  # as an orchestrator would (SIGINT is ignored under a background shell)
    assert left == [], f"left behind: {[(p.pid, p.name()) for p in left]}"


def generate_requests_per_worker(d: Deployment) -> list[int]:
    """Requests each worker's Dynamo endpoint served (its system server's /metrics, port P+i)."""
    counts = []
    for i in (1, 2):
        text = httpx.get(f"{d.worker_url(i)}/metrics", timeout=10).text
        found = re.findall(r'^dynamo_component_requests_total\{[^}]*dynamo_endpoint="generate"[^}]*\} (\d+)', text, re.M)
        counts.append(sum(int(n) for n in found))
    return counts


def test_plain_chat_answers_hello_world(hook_dynamo: Deployment) -> None:
    reply = openai_client(hook_dynamo).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert reply.choices[0].message.content == HELLO
    assert reply.choices[0].finish_reason == "stop"


def test_streaming_chat_answers_hello_world(hook_dynamo: Deployment) -> None:
    stream = openai_client(hook_dynamo).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == HELLO
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_two_workers_share_the_load_and_both_apply_the_spec(hook_dynamo: Deployment) -> None:
    client = openai_client(hook_dynamo)
    before = generate_requests_per_worker(hook_dynamo)
    answers = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"Question {i}?"}],
                                              max_tokens=32).choices[0].message.content for i in range(8)]
    served = [b - a for a, b in zip(before, generate_requests_per_worker(hook_dynamo), strict=True)]
    assert answers == [HELLO] * 8
    assert sum(served) == 8 and min(served) >= 2, f"requests per worker: {served}"


def test_the_token_level_route_runs_the_spec_too(hook_dynamo: Deployment, embedded_tokenizer) -> None:  # noqa: ANN001
    reply = generate_tokens(hook_dynamo, [10, 20, 30], {"max_tokens": 16})
    assert reply.status_code == 200, reply.text
    expected = [*embedded_tokenizer.encode(HELLO, add_special_tokens=False), embedded_tokenizer.eos_token_id]
    assert reply.json()["choices"][0]["token_ids"] == expected


@pytest.mark.parametrize(("entry", "rule"), [
    ({"kind": "banned_tokens", "token_ids": [1]}, "kind 'banned_tokens' is not allowed by this deployment"),
    ({"kind": "python", "factory": "os:system"}, "kind 'python' is operator-only and may not be sent in a request")])
def test_a_client_payload_outside_the_allow_list_fails_its_request_alone(hook_dynamo: Deployment, entry: dict,
                                                                         rule: str) -> None:
    mark = hook_dynamo.log_size()
    reply = generate_tokens(hook_dynamo, [10, 20, 30], {"max_tokens": 4, "extra_args": {"dynamo_logits": [entry]}})
    assert reply.status_code == 400
    # Dynamo 1.6.1's frontend answers "Invalid request"; the worker logged our rule, naming the field.
    hook_dynamo.wait_for_log(f"extra_args.dynamo_logits[0].kind: {rule}", mark)
    assert openai_client(hook_dynamo).chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content == HELLO


def test_dynamos_frontend_refuses_unknown_request_fields(hook_dynamo: Deployment) -> None:
    """What Dynamo 1.6.1 does not allow (docs/dynamo.md): per-request specs as chat body fields."""
    with pytest.raises(openai.BadRequestError, match="Unsupported parameter"):
        openai_client(hook_dynamo).chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"logits_processors": [{"kind": "forced_text", "text": "x"}]})
