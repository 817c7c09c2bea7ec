"""Admission follows a ``trigger``'s phrase (``dynlogits.specs.consistency``): wherever the trigger is
written the phrase is forced, so a position-free mask of its scale on a phrase token is refused
naming both entries, and so is a stop id ``min_tokens`` still masks where the phrase comes when
the trigger is written at the earliest; a trigger those masks never let the output write never
fires and passes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from spec_refusals import admitted, fails_writing, refusal, row_left

from dynlogits.specs import SpecError, decode_wire_payload

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


def test_a_forced_sequence_and_trigger_of_different_scopes_are_not_followed() -> None:
    forced = {"kind": "forced_sequence", "token_ids": [5, 30, 31, 50], "eos_token_id": 2}
    decode_wire_payload([REASONING, {**forced, "scope": "answer"}, TRIGGER])
    decode_wire_payload([REASONING, forced, {**TRIGGER, "scope": "answer"}])


def test_a_forced_sequence_and_trigger_of_one_scope_are_followed_on_its_stretch() -> None:
    forced = {"kind": "forced_sequence", "token_ids": [5, 30, 31, 50], "eos_token_id": 2, "scope": "answer"}
    payload = [REASONING, forced, {**TRIGGER, "scope": "answer"}]
    assert refusal(payload) == (
        "dynamo_logits[2]: contradicts the entries before it: it forces token 40 (phrase_token_ids[0]) at answer "
        "position 3 once its trigger is written at answer positions 1..2, where dynamo_logits[1] forces token 50; "
        "the row would have no token left")
    assert fails_writing(payload, [5, 30, 31, 50])  # the answer from the first token on


@pytest.mark.parametrize("token_ids", [[5, 30, 31, 50, 51], [5, 30, 31, 40, 41], [30, 31, 40, 9], [30, 31],
                                       [5, 30, 31, 40, 41, 42, 7], [5, 31, 30, 6], [30, 31, 40, 41, 42]])
def test_admission_refuses_exactly_the_forced_sequences_the_realized_trigger_fails_on(token_ids: list[int]) -> None:
    payload = [{"kind": "forced_sequence", "token_ids": token_ids, "eos_token_id": 2}, TRIGGER]
    assert fails_writing(payload, [*token_ids, 2]) != admitted(payload)  # the sequence, then its EOS: it ends there


MIN_TOKENS = {"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [42]}


def test_a_phrase_token_min_tokens_holds_where_the_trigger_can_put_it_is_refused_in_either_order() -> None:
    assert refusal([TRIGGER, MIN_TOKENS]) == (
        "dynamo_logits[1]: contradicts the entries before it: it masks token 42 before output position 5, which "
        "dynamo_logits[0] forces (its phrase_token_ids[2]) at output position 4 when its trigger is written at the "
        "earliest (output positions 0..1); the row would have no token left")
    assert refusal([MIN_TOKENS, TRIGGER]) == (
        "dynamo_logits[1]: contradicts the entries before it: it forces token 42 (phrase_token_ids[2]) at output "
        "position 4 when its trigger is written at the earliest (output positions 0..1), which dynamo_logits[0] "
        "masks before output position 5; the row would have no token left")
    assert fails_writing([TRIGGER, MIN_TOKENS], [30, 31, 40, 41, 42])


@pytest.mark.parametrize("payload", [
    [TRIGGER, {**MIN_TOKENS, "min_tokens": 4}],  # the phrase's stop id comes at position 4 at the earliest
    [TRIGGER, MIN_TOKENS, {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [31]}],  # trigger from position 1
    [TRIGGER, {**MIN_TOKENS, "stop_token_ids": [42, 30]}],  # its own trigger token held until position 5
    [REASONING, {**TRIGGER, "scope": "answer"}, MIN_TOKENS],  # another position scale: not known to meet
    [TRIGGER, MIN_TOKENS, {"kind": "forced_sequence", "token_ids": [5, 6, 7, 8, 9], "eos_token_id": 2}],
], ids=["past min_tokens", "trigger held back", "trigger token is a stop id", "scoped trigger", "fixed output"])
def test_a_trigger_min_tokens_cannot_meet_in_its_phrase_is_admitted(payload: list[dict[str, Any]]) -> None:
    decode_wire_payload(payload)


def _leaves_a_row_empty(payload: list[dict[str, Any]]) -> bool:
    """Brute force over every output the entries let a request write (ids 2..9, and 50 for every id
    no entry names; ``row_left`` at each), outputs merged where all that follows is the same
    (position, last tokens, how much of the phrase is written), up to the position past which
    nothing changes: whether one reaches a row with no token."""
    trigger = next(e for e in payload if e["kind"] == "trigger")
    cue, phrase = tuple(trigger["trigger_token_ids"]), trigger["phrase_token_ids"]
    window = max([len(cue), *(len(p) for e in payload if e["kind"] == "banned_phrases" for p in e["phrases"])])
    horizon = max([0, *(e["min_tokens"] for e in payload if e["kind"] == "min_tokens")]) + len(cue) + len(phrase) + window
    seen: set[tuple[Any, ...]] = set()
    outputs: list[tuple[int, ...]] = [()]
    while outputs:
        written = outputs.pop()
        n = len(written)
        start = next((k for k in range(len(cue), n + 1) if written[k - len(cue):k] == cue), None)
        state = (n, written[-window:], None if start is None else min(n - start, len(phrase)))
        if state in seen or n > horizon:
            continue
        seen.add(state)
        allowed, masked = row_left(payload, written)
        left = [t for t in (*range(2, 10), 50) if (t in allowed if allowed is not None else t not in masked)]
        if not left:
            return True
        outputs += [(*written, t) for t in left]
    return False


def test_admission_refuses_exactly_the_payloads_whose_trigger_can_reach_an_empty_row() -> None:
    """Without a choice or forced sequence (their own walks decide): bans, allowed sets, ``min_tokens``
    and banned phrases of up to two tokens (they lie within what trigger and phrase write)."""
    rng, refused, by_min_tokens = random.Random(38), 0, 0
    for _ in range(600):
        payload: list[dict[str, Any]] = [{"kind": "trigger", "trigger_token_ids": rng.choices(range(2, 10), k=rng.randint(1, 2)),
                                          "phrase_token_ids": rng.choices(range(2, 10), k=rng.randint(1, 3))}]
        for kind in rng.choices(["banned_tokens", "allowed_tokens", "min_tokens", "min_tokens", "banned_phrases"],
                                k=rng.randint(1, 3)):
            payload.append({"kind": kind, "token_ids": rng.sample(range(2, 10), rng.randint(1, 2))} if kind == "banned_tokens" else
                           {"kind": kind, "token_ids": rng.sample(range(2, 10), rng.randint(4, 7)),
                            "eos_token_id": rng.choice([2, 9])} if kind == "allowed_tokens" else
                           {"kind": kind, "min_tokens": rng.randint(1, 6), "stop_token_ids": rng.sample(range(2, 10), rng.randint(1, 2))}
                           if kind == "min_tokens" else
                           {"kind": kind, "phrases": [rng.choices(range(2, 10), k=rng.randint(1, 2)) for _ in range(rng.randint(1, 2))]})
        rng.shuffle(payload)
        try:
            decode_wire_payload(payload)
            ok = True
        except SpecError as err:
            ok, refused, by_min_tokens = False, refused + 1, by_min_tokens + ("before output position" in str(err))
        assert ok != _leaves_a_row_empty(payload), payload
    assert 100 < refused < 300 and by_min_tokens > 20  # both verdicts, and refusals the min_tokens rule makes
