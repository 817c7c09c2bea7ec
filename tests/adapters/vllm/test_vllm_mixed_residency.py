"""A request holding built-in and plug-in entries on the real vLLM classes (V1 runner and Model
Runner V2, through the kit's drivers): its built-ins stay resident on the slot engine and only its
trailing plug-in entries run per row, the rows exactly the entries applied in payload order; a
plug-in entry before a built-in keeps the whole request per row (order could not hold otherwise)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dynlogits import sdk
from dynlogits.adapters.vllm.conformance import drivers
from dynlogits.testing import plugin_kinds

VOCAB = 1024  # the embedded model's logits width: what the vLLM drivers serve
EOS = 1
PROMPT = (3, 4)
BUILT_INS = [{"kind": "banned_tokens", "token_ids": [5]}, {"kind": "logit_bias", "bias": {"7": 3.0, "8": -2.0}}]
KEEP = {"kind": "kit.keep_only", "token_ids": [5, 6, 7, 8, 9, EOS]}


@pytest.fixture(params=["vllm-v1", "vllm-v2"])
def driver(request: pytest.FixtureRequest) -> Any:
    with plugin_kinds.registered():
        yield next(d for d in drivers(vocab_size=VOCAB) if d.name == request.param)


def _resident_parts(driver: Any) -> list[Any]:
    return [r for r in driver.processor._resident.requests if r is not None]


def _reference(payload: list[dict[str, Any]]) -> Any:
    request = sdk.realize(payload, vocab_size=VOCAB, stop_token_id=EOS,
                          facts=sdk.RequestFacts.of(prompt_ids=PROMPT, eos_token_id=EOS))
    assert request is not None and request.processor is not None
    return request.processor


def _run(driver: Any, payload: list[dict[str, Any]], steps: int = 4) -> list[int]:
    """``payload``'s request beside a plain one, each row checked against the entries applied in order."""
    reference = _reference(payload)
    driver.add("mixed", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    driver.add("plain", None, prompt_ids=PROMPT, eos_token_id=EOS)
    history: list[int] = []
    for step in range(steps):
        raw = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(step))
        want = raw[1].clone()
        reference(history, want)
        out = driver.step(["plain", "mixed"], raw.clone())
        assert torch.equal(out[0], raw[0])
        assert torch.allclose(out[1], want), step
        history.append(int(out[1].argmax()))
        driver.commit("mixed", history[-1])
        driver.commit("plain", int(out[0].argmax()))
    return history


def test_built_ins_stay_resident_and_only_the_trailing_plugin_entry_runs_per_row(driver):
    history = _run(driver, [*BUILT_INS, KEEP])
    (part,) = _resident_parts(driver)
    assert [type(p).__name__ for p in part.processor.processors] == ["BannedTokensProcessor", "LogitBiasProcessor"]
    assert set(history) <= {6, 7, 8, 9, EOS} and 7 in history  # banned 5 never, the bias on 7 wins
    assert driver.failures() == []


def test_a_plugin_entry_before_a_built_in_keeps_the_whole_request_per_row(driver):
    _run(driver, [KEEP, *BUILT_INS])
    assert _resident_parts(driver) == []
    assert driver.failures() == []


def test_a_request_of_built_ins_alone_is_resident_whole(driver):
    _run(driver, BUILT_INS)
    (part,) = _resident_parts(driver)
    assert len(part.processor.processors) == 2


def test_a_failing_plugin_entry_fails_the_whole_request_naming_its_entry(driver):
    payload = [*BUILT_INS, {"kind": "kit.raise_after", "after": 2}]
    driver.add("mixed", payload, prompt_ids=PROMPT, eos_token_id=EOS)
    for step in range(4):
        raw = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(10 + step))
        out = driver.step(["mixed"], raw.clone())
        if step == 0:  # the V1 runner realizes a request at its first step
            (part,) = _resident_parts(driver)
            whole = part.whole
        if step < 2:
            assert out[0, 5] == float("-inf") and torch.isfinite(out[0]).sum() == VOCAB - 1
        else:  # raised at position 2: fail-stopped to its EOS from then on
            assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [EOS]
        driver.commit("mixed", int(out[0].argmax()))
    assert whole.failed and part.failed and whole.failure.processor == 2 and whole.failure.position == 2
    assert len(driver.failures()) == 1 and "injected fault" in driver.failures()[0]
