"""Admission refuses a ``forced_sequence`` that writes a phrase a ``banned_phrases`` entry bans
(``dynlogits.specs.consistency``): the row at the phrase's last token would have no token left."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import SpecError, decode_wire_payload


def _forced(ids: list[int], eos: int = 2, **extra: Any) -> dict[str, Any]:
    return {"kind": "forced_sequence", "token_ids": ids, "eos_token_id": eos, **extra}


def _ban(*phrases: list[int], **extra: Any) -> dict[str, Any]:
    return {"kind": "banned_phrases", "phrases": list(phrases), **extra}


@pytest.mark.parametrize("order", ["ban first", "forced first"])
def test_a_forced_sequence_writing_a_banned_phrase_is_refused_naming_both_entries(order: str) -> None:
    payload = [_ban([9], [5, 6]), _forced([4, 5, 6, 7])]
    if order == "forced first":
        payload.reverse()
    ban, forced = (0, 1) if order == "ban first" else (1, 0)
    with pytest.raises(SpecError) as err:
        decode_wire_payload(payload)
    (problem,) = err.value.problems
    assert problem.path == f"dynamo_logits[{ban}].phrases[1]"
    assert problem.rule.startswith(f"dynamo_logits[{forced}] writes this phrase at output positions 1..2, so it forces "
                                   "token 6 at output position 2, which the ban masks"), problem.rule


def test_the_eos_a_forced_sequence_ends_with_counts_as_written() -> None:
    with pytest.raises(SpecError, match=r"phrases\[0\]: dynamo_logits\[0\] writes this phrase at output positions 2\.\.3"):
        decode_wire_payload([_forced([4, 5, 6]), _ban([6, 2])])


@pytest.mark.parametrize("phrases", [[[6, 5]], [[5, 6, 8]], [[3, 4, 5]], [[4, 5, 6, 7, 2, 2]]])
def test_phrases_the_forced_sequence_never_completes_are_admitted(phrases: list[list[int]]) -> None:
    """Reversed, continued past the sequence, or starting before the output (the prompt does not count)."""
    decode_wire_payload([_forced([4, 5, 6, 7]), _ban(*phrases)])


def test_entries_of_the_same_scope_are_compared_and_of_different_scopes_are_not() -> None:
    reasoning = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}
    with pytest.raises(SpecError, match="writes this phrase"):
        decode_wire_payload([reasoning, _forced([5, 6], scope="answer"), _ban([5, 6], scope="answer")])
    # the ban sees the reasoning stretch, the forced sequence the answer's: nothing known at admission
    decode_wire_payload([reasoning, _forced([5, 6], scope="answer"), _ban([5, 6], scope="reasoning")])
