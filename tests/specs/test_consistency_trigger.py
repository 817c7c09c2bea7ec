"""Admission follows a ``trigger``'s phrase (``dynlogits.specs.consistency``): wherever the trigger is
written the phrase is forced, so a position-free mask of its scale on a phrase token is refused
naming both entries; a trigger those masks never let the output write never fires and passes."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import decode_wire_payload
from spec_refusals import admitted, fails_writing, refusal

TRIGGER = {"kind": "trigger", "trigger_token_ids": [30, 31], "phrase_token_ids": [40, 41, 42]}
REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}


def test_a_ban_on_a_phrase_token_is_refused_in_either_order() -> None:
    ban = {"kind": "banned_tokens", "token_ids": [41]}
    assert refusal([TRIGGER, ban]) == (
        "dynamo_logits[1]: contradicts the entries before it: it masks token 41, which dynamo_logits[0] forces (its "
        "phrase_token_ids[1]) once its trigger is written; the row would have no token left")
    assert refusal([ban, TRIGGER]) == (
        "dynamo_logits[1]: contradicts the entries before it: it forces token 41 (phrase_token_ids[1]) once its "
        "trigger is written, which dynamo_logits[0] masks; the row would have no token left")


def test_an_allowed_set_without_a_phrase_token_is_refused() -> None:
    allowed = {"kind": "allowed_tokens", "token_ids": [30, 31, 40, 41], "eos_token_id": 2}
    assert "does not allow token 42, which dynamo_logits[0] forces (its phrase_token_ids[2])" in refusal([TRIGGER, allowed])


def test_a_banned_phrase_that_trigger_and_phrase_write_is_refused() -> None:
    assert "forces token 40 (phrase_token_ids[0])" in refusal([{"kind": "banned_phrases", "phrases": [[31, 40]]}, TRIGGER])
    decode_wire_payload([{"kind": "banned_phrases", "phrases": [[5, 40]]}, TRIGGER])  # needs a token before it: unknown


@pytest.mark.parametrize("never_written", [
    {"kind": "banned_tokens", "token_ids": [31, 41]},
    {"kind": "allowed_tokens", "token_ids": [30, 40, 41], "eos_token_id": 2},
    {"kind": "banned_phrases", "phrases": [[30, 31], [41]]},
], ids=["trigger token banned", "trigger token not allowed", "trigger is a banned phrase"])
def test_a_trigger_the_masks_never_let_the_output_write_is_admitted(never_written: dict[str, Any]) -> None:
    decode_wire_payload([never_written, TRIGGER])


def test_scopes_meet_as_for_the_other_kinds() -> None:
    scoped = {**TRIGGER, "scope": "answer"}
    assert "dynamo_logits[2]: " in refusal([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [41]}])
    decode_wire_payload([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [41], "scope": "reasoning"}])
    # an always trigger may fire in either phase: a ban of one phase is not known to meet it
    decode_wire_payload([REASONING, TRIGGER, {"kind": "banned_tokens", "token_ids": [41], "scope": "answer"}])


def test_a_forced_sequence_that_writes_the_trigger_must_go_on_with_the_phrase() -> None:
    forced = {"kind": "forced_sequence", "token_ids": [5, 30, 31, 50, 51, 52], "eos_token_id": 2}
    assert refusal([forced, TRIGGER]) == (
        "dynamo_logits[1]: contradicts the entries before it: it forces token 40 (phrase_token_ids[0]) at output "
        "position 3 once its trigger is written at output positions 1..2, where dynamo_logits[0] forces token 50; "
        "the row would have no token left")
    assert refusal([TRIGGER, forced]) == (
        "dynamo_logits[1]: contradicts the entries before it: it forces token 50 at output position 3, where "
        "dynamo_logits[0] forces token 40 (its phrase_token_ids[0]) once its trigger is written at output positions "
        "1..2; the row would have no token left")


@pytest.mark.parametrize("token_ids, position", [([5, 30, 31, 40, 41], 5), ([30, 31, 40, 9], 3), ([30, 31, 40], 3),
                                                 ([30, 31], 2)],
                         ids=["phrase runs into EOS", "sequence leaves the phrase", "EOS part-way", "EOS first"])
def test_a_forced_sequence_that_leaves_the_phrase_part_way_is_refused_there(token_ids: list[int], position: int) -> None:
    forced = {"kind": "forced_sequence", "token_ids": token_ids, "eos_token_id": 2}
    assert f"at output position {position} " in refusal([forced, TRIGGER])


@pytest.mark.parametrize("token_ids, trigger", [
    ([5, 30, 31, 40, 41, 42, 7], TRIGGER),
    ([5, 31, 30, 6], TRIGGER),
    ([5, 30], {**TRIGGER, "trigger_token_ids": [30, 2]}),
], ids=["writes the phrase", "never writes the trigger", "trigger ends with EOS: the output ends there"])
def test_a_forced_sequence_the_trigger_agrees_with_is_admitted(token_ids: list[int], trigger: dict[str, Any]) -> None:
    decode_wire_payload([{"kind": "forced_sequence", "token_ids": token_ids, "eos_token_id": 2}, trigger])


def test_a_scoped_forced_sequence_or_trigger_is_not_followed() -> None:
    forced = {"kind": "forced_sequence", "token_ids": [5, 30, 31, 50], "eos_token_id": 2}
    decode_wire_payload([REASONING, {**forced, "scope": "answer"}, TRIGGER])
    decode_wire_payload([REASONING, forced, {**TRIGGER, "scope": "answer"}])


@pytest.mark.parametrize("token_ids", [[5, 30, 31, 50, 51], [5, 30, 31, 40, 41], [30, 31, 40, 9], [30, 31],
                                       [5, 30, 31, 40, 41, 42, 7], [5, 31, 30, 6], [30, 31, 40, 41, 42]])
def test_admission_refuses_exactly_the_forced_sequences_the_realized_trigger_fails_on(token_ids: list[int]) -> None:
    payload = [{"kind": "forced_sequence", "token_ids": token_ids, "eos_token_id": 2}, TRIGGER]
    assert fails_writing(payload, [*token_ids, 2]) != admitted(payload)  # the sequence, then its EOS: it ends there
