"""A payload is checked for contradictions once, where the request enters vLLM (``validate_params``),
and realized in the model runner with O(payload) checks only: never per child of ``n``, never again."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm.request import realize_request, validate  # noqa: E402
from dynlogits.specs import WIRE_KEY, SpecError, wire  # noqa: E402


# a forced token the ban masks: admission refuses it; the bias id keeps each test's payload its own
def _contradiction(salt: int) -> list[dict[str, Any]]:
    return [{"kind": "banned_tokens", "token_ids": [5]},
            {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 0},
            {"kind": "logit_bias", "bias": {str(200 + salt): 1.0}}]


def test_validate_params_refuses_a_contradiction_where_the_request_enters() -> None:
    with pytest.raises(SpecError, match="contradicts"):
        validate(SamplingParams(extra_args={WIRE_KEY: _contradiction(1)}))


@pytest.mark.parametrize("carried", ["list", "json text"])
def test_the_model_runner_realizes_without_walking_the_payload_again(monkeypatch: pytest.MonkeyPatch,
                                                                     carried: str) -> None:
    def walked(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model runner ran the consistency walks again")

    monkeypatch.setattr(wire, "check_consistency", walked)
    if carried == "list":
        payload: Any = [{"kind": "banned_tokens", "token_ids": [7]}, {"kind": "logit_bias", "bias": {"9": 1.0}}]
    else:
        monkeypatch.setenv("DYN_LOGITS_REQUEST_KINDS", "banned_tokens,logit_bias")
        payload = json.dumps([{"kind": "banned_tokens", "token_ids": [8]}, {"kind": "logit_bias", "bias": {"9": 1.0}}])
    for _child in range(16):  # n=16: each child is realized on its own
        request = realize_request(SamplingParams(extra_args={WIRE_KEY: payload}), vocab_size=1000)
        assert request is not None and not request.failed
