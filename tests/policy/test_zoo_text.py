"""The worker resolves the zoo's text fields with its tokenizer (``dynlogits.policy.text``):
multiple-choice texts and a trigger's texts as given (no special tokens, no space added), a multiple
choice's EOS from the tokenizer, and a text longer than its id field allows named at the text."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.text import resolve_entries
from dynlogits.specs import SpecError, SpecLimits, parse_entries


def _resolve(tokenizer: Any, entries: list[dict[str, Any]], **limits: int) -> tuple[Any, ...]:
    return resolve_entries(parse_entries(entries), tokenizer, limits=SpecLimits(**limits))


def _ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def test_choice_texts_follow_the_given_choices_and_end_with_the_tokenizers_eos(embedded_tokenizer: Any) -> None:
    (entry,) = _resolve(embedded_tokenizer, [{"kind": "multiple_choice", "choices": [[5]], "texts": ["yes", " no"]}])
    assert entry.choices == ((5,), _ids(embedded_tokenizer, "yes"), _ids(embedded_tokenizer, " no"))
    assert _ids(embedded_tokenizer, " no") != _ids(embedded_tokenizer, "no")  # as given: the space is kept
    assert entry.texts == () and entry.eos_token_id == embedded_tokenizer.eos_token_id


def test_trigger_texts_become_their_tokens(embedded_tokenizer: Any) -> None:
    (entry,) = _resolve(embedded_tokenizer, [{"kind": "trigger", "trigger_text": "Answer:", "phrase_text": " yes"}])
    assert entry.trigger_token_ids == _ids(embedded_tokenizer, "Answer:")
    assert entry.phrase_token_ids == _ids(embedded_tokenizer, " yes")
    assert entry.trigger_text is None and entry.phrase_text is None


@pytest.mark.parametrize(("entry", "path"), [
    ({"kind": "multiple_choice", "texts": ["yes", "hello world hello"]}, "entries[0].texts[1]"),
    ({"kind": "trigger", "trigger_token_ids": [5], "phrase_text": "hello world hello"}, "entries[0].phrase_text"),
])
def test_a_text_longer_than_a_choice_or_phrase_may_be_is_named(embedded_tokenizer: Any, entry: dict[str, Any],
                                                               path: str) -> None:
    with pytest.raises(SpecError) as err:
        _resolve(embedded_tokenizer, [entry], max_phrase_tokens=2)
    (problem,) = err.value.problems
    assert problem.path == path and "(limit max_phrase_tokens)" in problem.rule
