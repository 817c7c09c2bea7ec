"""Text resolved by the worker's tokenizer is held to the spec limits of the ids it becomes
(``dynlogits.policy.text``), each problem named at the text: a banned phrase's text may become two
id sequences, and a short text many tokens."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.text import resolve_entries
from dynlogits.specs import SpecError, SpecLimits, parse_entries


def _resolve(tokenizer: Any, entries: list[dict[str, Any]], **limits: int) -> tuple[Any, ...]:
    return resolve_entries(parse_entries(entries), tokenizer, limits=SpecLimits(**limits))


def test_phrases_count_after_each_text_becomes_its_variants(embedded_tokenizer: Any) -> None:
    entry = {"kind": "banned_phrases", "phrases": [[5]], "texts": ["hello world"]}  # 2 variants + 1 given
    (resolved,) = _resolve(embedded_tokenizer, [entry], max_phrases=3)
    assert len(resolved.phrases) == 3 and resolved.texts == ()
    with pytest.raises(SpecError) as err:
        _resolve(embedded_tokenizer, [entry], max_phrases=2)
    assert str(err.value) == ("entries[0].texts: resolves to 3 token sequences with this worker's tokenizer; "
                              "must be at most 2 (limit max_phrases)")


@pytest.mark.parametrize(("entry", "limits", "path", "limit"), [
    ({"kind": "banned_phrases", "texts": ["hi", "hello world hello"]}, {"max_phrase_tokens": 2}, "entries[0].texts[1]",
     "max_phrase_tokens"),
    ({"kind": "forced_text", "text": "hello world hello"}, {"max_token_ids": 2}, "entries[0].text", "max_token_ids"),
    ({"kind": "thinking_budget", "start_text": "hello world hello", "end_token_ids": [6], "budget": 1},
     {"max_token_ids": 2}, "entries[0].start_text", "max_token_ids"),
])
def test_a_text_with_more_tokens_than_its_id_field_allows_is_named(embedded_tokenizer: Any, entry: dict[str, Any],
                                                                    limits: dict[str, int], path: str, limit: str) -> None:
    with pytest.raises(SpecError) as err:
        _resolve(embedded_tokenizer, [entry], **limits)
    (problem,) = err.value.problems
    assert problem.path == path and problem.rule.startswith("is 3 tokens with this worker's tokenizer; must be at most 2")
    assert f"(limit {limit})" in problem.rule and "hello" not in problem.rule
