"""``thinking_budget`` beside vLLM's own thinking budget: the same start from the prompt, and the two
never on one request."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.processors.spans import prompt_span  # noqa: E402
from dynlogits.specs import WIRE_KEY, SpecError  # noqa: E402

DELIMITERS = [((10,), (11,)), ((10, 12), (11,)), ((10,), (11, 13)), ((10, 12), (11, 13))]


def _occurs_after(prompt: list[int], seq: tuple[int, ...], begin: int) -> bool:
    """Whether ``seq`` ends somewhere in ``prompt`` after position ``begin`` (a prefix length)."""
    return any(tuple(prompt[upto - len(seq) : upto]) == seq for upto in range(begin + len(seq), len(prompt) + 1))


@pytest.mark.parametrize(("start", "end"), DELIMITERS)
def test_the_span_a_prompt_leaves_open_is_the_one_vllms_thinking_budget_starts_in(start, end):
    """For random prompts, whether generation starts inside a span and how many of the prompt's tokens
    count against the budget are what vLLM's ``ThinkingBudgetStateHolder._init_state_entry`` finds;
    except where the start sequence repeats inside the open span: vLLM counts from its last
    occurrence, the span (docs/specs.md) began at its first, so every thinking token counts."""
    config = SimpleNamespace(reasoning_start_token_ids=list(start), reasoning_end_token_ids=list(end))
    holder = ThinkingBudgetStateHolder(config, 1, 0, torch.device("cpu"), False)  # type: ignore[arg-type]
    rng = random.Random(len(start) * 10 + len(end))
    opened = repeated = 0
    for _ in range(2000):
        prompt = [rng.choice([5, 10, 11, 12, 13]) for _ in range(rng.randint(0, 14))]
        state = holder._init_state_entry(prompt, 1000)
        span = prompt_span(prompt, start, end)
        assert state["in_think"] == (span is not None), prompt
        ours = 0 if span is None else -span
        if state["think_count"] != ours:
            began = len(prompt) - ours  # where our span's thinking tokens begin
            assert state["think_count"] < ours and _occurs_after(prompt, start, began), prompt
            repeated += 1
        opened += span is not None
    assert opened > 100 and repeated > 10  # both kinds of prompt were exercised


def _params(payload: list[dict], **kwargs: object) -> SamplingParams:
    return SamplingParams(extra_args={WIRE_KEY: payload}, **kwargs)  # type: ignore[arg-type]


def test_vllms_thinking_token_budget_and_a_thinking_budget_entry_are_refused_together_naming_both():
    ours = [{"kind": "thinking_budget", "start_token_ids": [10], "end_token_ids": [11], "budget": 4}]
    with pytest.raises(SpecError) as info:
        DynamoVllmLogitsProcessor.validate_params(_params(ours, thinking_token_budget=8))
    message = str(info.value)
    assert "thinking_token_budget" in message and f"{WIRE_KEY}[0]" in message, message
    DynamoVllmLogitsProcessor.validate_params(_params(ours))  # each alone is admitted
    DynamoVllmLogitsProcessor.validate_params(_params([{"kind": "banned_tokens", "token_ids": [3]}],
                                                      thinking_token_budget=8))


def test_with_the_engine_as_spec_source_the_deployments_thinking_budget_counts_too(tmp_path, monkeypatch):
    config = tmp_path / "spec.yaml"
    config.write_text("entries:\n  - {kind: thinking_budget, start_token_ids: [10], end_token_ids: [11], budget: 4}\n")
    monkeypatch.setenv("DYN_LOGITS_SPEC_SOURCE", "engine")
    monkeypatch.setenv("DYN_LOGITS_SPEC", str(config))
    with pytest.raises(SpecError, match=r"thinking_token_budget: .*deployment entries\[0\] \(thinking_budget\)"):
        DynamoVllmLogitsProcessor.validate_params(SamplingParams(thinking_token_budget=8))
    DynamoVllmLogitsProcessor.validate_params(SamplingParams())
