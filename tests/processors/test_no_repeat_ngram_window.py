"""``no_repeat_ngram`` decided on the device under Model Runner V2 (``no_repeat_ngram_device``),
through ``V2SamplerHarness``: the window is as wide as the longest history a member's kept sample
sees (``max_tokens`` without ``include_prompt``, not the prompt too), and rows that fill it, members
of smaller sizes beside larger ones, ids past the logits width and a placeholder right after a
repeated n-gram all mask what transformers masks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.processors.no_repeat_ngram import KIND, NoRepeatNgramGroup, banned_after  # noqa: E402
from dynlogits.processors.no_repeat_ngram_device import window_width  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

VOCAB = 64
EOS = 1


def sp(payload: Any, max_tokens: int = 1000) -> SamplingParams:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args={WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def _entry(size: int, include_prompt: bool = False) -> list[dict[str, Any]]:
    return [{"kind": KIND, "size": size, "include_prompt": include_prompt}]


def _masked(row: torch.Tensor) -> list[int]:
    return torch.isneginf(row).nonzero().flatten().tolist()


def _want(size: int, history: list[int]) -> list[int]:
    return sorted(t for t in banned_after(history, size) if t < VOCAB)


def _harness(max_model_len: int = 128) -> V2SamplerHarness:
    config = SimpleNamespace(speculative_config=None, use_v2_model_runner=True, model_config=None)
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4, vllm_config=config,
                            max_model_len=max_model_len)


def _group(harness: V2SamplerHarness) -> NoRepeatNgramGroup:
    (group,) = [g for g in harness.processor._resident.groups.values() if isinstance(g, NoRepeatNgramGroup)]
    return group


def test_the_window_spans_max_tokens_not_the_prompt_without_include_prompt() -> None:
    harness = _harness(max_model_len=200)
    prompt = [2, 3, 2, 3] * 20  # a long prompt whose bigrams do not count
    output = [4, 5]
    harness.add_request("a", prompt, sp(_entry(2), max_tokens=8), output_ids=list(output))
    for step in range(6):  # every step until max_tokens: the whole output is in the window
        out = harness.step(["a"], torch.zeros(1, VOCAB))
        history = harness.output_ids("a")
        assert _masked(out[0]) == _want(2, history), (step, history)
        harness.commit("a", [(4, 5, 4, 6, 4, 7)[step]])
    assert _group(harness).width == 8 + 1 == window_width(200, [8], 2)  # of 200


@pytest.mark.parametrize("include_prompt", [False, True])
def test_members_of_smaller_sizes_mask_their_whole_history_when_it_fills_the_window(include_prompt: bool) -> None:
    """A size-1 member beside a size-4 one: every token of its history is a follower (the window
    holds ``size - 1`` columns more than the longest kept history), up to its last kept step."""
    harness = _harness()
    prompt = [9, 10, 11]
    harness.add_request("small", prompt, sp(_entry(1, include_prompt), max_tokens=6), output_ids=[2])
    harness.add_request("large", prompt, sp(_entry(4, include_prompt), max_tokens=6), output_ids=[3, 4, 5, 3, 4])
    for step in range(4):
        out = harness.step(["small", "large"], torch.zeros(2, VOCAB))
        for row, name in enumerate(["small", "large"]):
            history = (prompt if include_prompt else []) + harness.output_ids(name)
            assert _masked(out[row]) == _want(1 if name == "small" else 4, history), (step, name, history)
        harness.commit("small", [step + 20])
        harness.commit("large", [5])


def test_ids_past_the_logits_width_are_not_masked_on_the_device() -> None:
    harness = _harness()
    prompt = [VOCAB + 3, 7, VOCAB + 3]
    harness.add_request("a", prompt, sp(_entry(2, True)), output_ids=[7])
    out = harness.step(["a"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == _want(2, prompt + [7]) == []  # (7, VOCAB + 3) is in the prompt: not a logit
    harness.add_request("b", [2], sp(_entry(1, True)), output_ids=[VOCAB + 9, 5])
    out = harness.step(["b"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == [2, 5]


def test_a_placeholder_after_a_repeated_window_is_never_masked_in_its_place() -> None:
    harness = _harness()
    harness.add_request("a", [8], sp(_entry(2)), output_ids=[3, -1, 3])  # (3, -1) skipped: 3 was never followed
    out = harness.step(["a"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == _want(2, [3, -1, 3]) == []
    harness.add_request("b", [8], sp(_entry(3)), output_ids=[3, 4, -1, 2, 3, 4])  # (3, 4, -1) skipped
    out = harness.step(["b"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == _want(3, [3, 4, -1, 2, 3, 4]) == []
