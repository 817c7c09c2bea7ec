"""The kit's Model Runner V2 driver takes histories as long as the engine allows (its max_model_len)
and refuses a longer one with a message naming that limit, never with a harness's raw error."""

from __future__ import annotations

import pytest
import torch

from dynlogits.adapters.vllm.conformance import VllmV2Driver

VOCAB = 1024  # the embedded model's logits width
EOS = 1


@pytest.fixture(scope="module")
def driver() -> VllmV2Driver:
    return VllmV2Driver(VOCAB)


def test_a_history_longer_than_the_old_64_tokens_is_driven_to_the_engines_limit(driver):
    limit = driver.max_model_len
    forced = [{"kind": "forced_sequence", "token_ids": [10 + i % 500 for i in range(limit)], "eos_token_id": EOS}]
    prompt = (3, 4)
    history = [10 + i % 500 for i in range(300)]
    driver.add("long", forced, prompt_ids=prompt, output_ids=history, eos_token_id=EOS)
    for _ in range(limit - len(prompt) - len(history)):
        out = driver.step(["long"], torch.zeros(1, VOCAB))
        want = 10 + len(history) % 500
        assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [want]
        driver.commit("long", want)
        history.append(want)
    with pytest.raises(ValueError, match=rf"would hold {limit + 1} tokens .*max_model_len is {limit}"):
        driver.commit("long", EOS)
    driver.remove("long")


def test_a_request_longer_than_the_limit_is_refused_naming_it(driver):
    limit = driver.max_model_len
    with pytest.raises(ValueError, match=rf"vllm-v2: request 'huge' would hold {limit + 1} tokens.*max_model_len is {limit}"):
        driver.add("huge", None, prompt_ids=(3,), output_ids=[5] * limit, eos_token_id=EOS)
