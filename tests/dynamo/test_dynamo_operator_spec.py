"""``./launch/agg.sh --runtime dynamo --logits-spec FILE``: the operator's spec applies to every
request on a real ``dynamo.vllm`` worker, and clients add allowed kinds through Dynamo's
token-level route. Real processes, real HTTP, the real ``openai`` client.

The spec bans every id of the embedded model but "Hello", " world", "!" and EOS, so whatever the
random weights prefer, every generated token must be one of those four.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from dynamo_helpers import HELLO, MODEL, Deployment, dynamo_deployment, generate_tokens, openai_client

pytestmark = pytest.mark.engine

VOCAB = 1024  # the embedded model's logits width
ONLY_ALLOWED = re.compile(r"^(Hello| world|!)+$")


@pytest.fixture(scope="module")
def kept_ids(embedded_tokenizer: Any) -> list[int]:
    return [*embedded_tokenizer.encode(HELLO, add_special_tokens=False), embedded_tokenizer.eos_token_id]


@pytest.fixture(scope="module")
def spec_dynamo(tmp_path_factory: pytest.TempPathFactory, kept_ids: list[int]) -> Iterator[Deployment]:
    config = tmp_path_factory.mktemp("dynamo-spec") / "logits.yaml"
    config.write_text(yaml.safe_dump({
        "entries": [{"kind": "banned_tokens", "token_ids": [i for i in range(VOCAB) if i not in kept_ids]}],
        "allow_request_kinds": ["forced_text", "min_tokens"],
    }))
    d = dynamo_deployment("dynamo-spec", args=["--logits-spec", str(config)])
    yield d
    d.stop(signal.SIGTERM)


@pytest.mark.parametrize("prompt", ["Tell me a story.", "2 + 2 =", "Write some code"])
def test_every_chat_request_runs_the_operators_banned_tokens(spec_dynamo: Deployment, prompt: str) -> None:
    reply = openai_client(spec_dynamo).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=12,
        extra_body={"ignore_eos": True})
    text = reply.choices[0].message.content
    assert reply.usage.completion_tokens == 12
    assert ONLY_ALLOWED.match(text), text


def test_streaming_requests_run_it_too(spec_dynamo: Deployment) -> None:
    stream = openai_client(spec_dynamo).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                                           stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert ONLY_ALLOWED.match(text), text


def test_the_token_level_route_runs_the_operator_spec(spec_dynamo: Deployment, kept_ids: list[int]) -> None:
    reply = generate_tokens(spec_dynamo, [11, 22, 33, 44], {"max_tokens": 16, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    ids = reply.json()["choices"][0]["token_ids"]
    assert len(ids) == 16 and set(ids) <= set(kept_ids), ids


def test_an_allowed_client_kind_runs_after_the_operators(spec_dynamo: Deployment, kept_ids: list[int]) -> None:
    reply = generate_tokens(spec_dynamo, [11, 22, 33, 44], {
        "max_tokens": 16, "extra_args": {"dynamo_logits": [{"kind": "forced_text", "text": HELLO}]}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["token_ids"] == kept_ids


def test_a_client_kind_the_operator_did_not_allow_is_refused(spec_dynamo: Deployment) -> None:
    mark = spec_dynamo.log_size()
    reply = generate_tokens(spec_dynamo, [11, 22], {
        "max_tokens": 4, "extra_args": {"dynamo_logits": [{"kind": "allowed_tokens", "token_ids": [1]}]}})
    assert reply.status_code == 400
    spec_dynamo.wait_for_log("extra_args.dynamo_logits[0].kind: kind 'allowed_tokens' is not allowed", mark)
