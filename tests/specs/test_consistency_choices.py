"""Admission follows ``multiple_choice`` at its first position (``dynlogits.specs.consistency``):
there it allows exactly its choices' first tokens, so entries that leave none of them are refused
naming both; past it, what it allows depends on the output, and nothing is refused for it."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import SpecError, decode_wire_payload

CHOICES = {"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": 2}
REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}


def _refusal(payload: list[dict[str, Any]]) -> str:
    with pytest.raises(SpecError) as err:
        decode_wire_payload(payload)
    (problem,) = err.value.problems
    return f"{problem.path}: {problem.rule}"


@pytest.mark.parametrize("earlier", [{"kind": "banned_tokens", "token_ids": [5, 7]},
                                     {"kind": "min_tokens", "min_tokens": 3, "stop_token_ids": [7, 5]}])
def test_choices_whose_first_tokens_earlier_entries_mask_are_refused(earlier: dict[str, Any]) -> None:
    assert _refusal([earlier, CHOICES]) == (
        "dynamo_logits[1]: contradicts the entries before it: it allows only its choices' first tokens, which earlier "
        "entries mask at output position 0; the row would have no token left")


def test_a_ban_after_the_choices_that_masks_every_first_token_is_refused() -> None:
    assert _refusal([CHOICES, {"kind": "banned_tokens", "token_ids": [7, 5, 6]}]).startswith(
        "dynamo_logits[1]: contradicts the entries before it: it masks every token dynamo_logits[0] leaves allowed at "
        "output position 0")


@pytest.mark.parametrize("other", [{"kind": "forced_sequence", "token_ids": [9], "eos_token_id": 2},
                                   {"kind": "allowed_tokens", "token_ids": [8, 9], "eos_token_id": 2}])
def test_a_first_token_forced_or_allowed_outside_the_choices_is_refused_in_either_order(other: dict[str, Any]) -> None:
    first, second = _refusal([other, CHOICES]), _refusal([CHOICES, other])
    assert first.startswith("dynamo_logits[1]: ") and "dynamo_logits[0] leaves allowed at output position 0" in first
    assert second.startswith("dynamo_logits[1]: ") and "dynamo_logits[0]" in second and "output position 0" in second


@pytest.mark.parametrize("payload", [
    [{"kind": "banned_tokens", "token_ids": [5]}, CHOICES],  # choice [7] is left
    [CHOICES, {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}],  # writes a choice
    [CHOICES, {"kind": "banned_tokens", "token_ids": [6]}],  # past the first position: not followed
    [{"kind": "multiple_choice", "texts": ["yes"]}, {"kind": "banned_tokens", "token_ids": [5, 7]}],  # unresolved
], ids=["one choice left", "forced choice", "later position", "texts"])
def test_choices_with_a_first_token_left_or_unknown_are_admitted(payload: list[dict[str, Any]]) -> None:
    if any("texts" in e for e in payload):  # texts never cross the wire: check the entries as a config would
        from dynlogits.specs import LogitsProcessorSpec
        from dynlogits.specs.consistency import consistency_problems

        assert consistency_problems(LogitsProcessorSpec(entries=payload).entries) == []
    else:
        decode_wire_payload(payload)


def test_choices_scoped_to_the_answer_meet_only_entries_acting_there() -> None:
    scoped = {**CHOICES, "scope": "answer"}
    decode_wire_payload([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [5, 7], "scope": "reasoning"}])
    assert "at output position 0" in _refusal([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [5, 7]}])
    assert "at answer position 0" in _refusal([REASONING, {"kind": "banned_tokens", "token_ids": [5, 7], "scope": "answer"},
                                               scoped])
