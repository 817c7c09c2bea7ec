"""Admission follows ``multiple_choice`` (``dynlogits.specs.consistency``): at its first position it
allows exactly its choices' first tokens, so entries that leave none of them are refused naming
both; past it, down every prefix of a choice the entries let the output write, the next tokens of
the choices it begins (and EOS after a whole choice) must not all be masked by the entries of its
position scale."""

from __future__ import annotations

import random
from typing import Any

import pytest
from spec_refusals import admitted, fails_writing, refusal, row_left

from dynlogits.specs import SpecError, decode_wire_payload

CHOICES = {"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": 2}
REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}


@pytest.mark.parametrize("earlier", [{"kind": "banned_tokens", "token_ids": [5, 7]},
                                     {"kind": "min_tokens", "min_tokens": 3, "stop_token_ids": [7, 5]}])
def test_choices_whose_first_tokens_earlier_entries_mask_are_refused(earlier: dict[str, Any]) -> None:
    assert refusal([earlier, CHOICES]) == (
        "dynamo_logits[1]: contradicts the entries before it: it allows only its choices' first tokens, which earlier "
        "entries mask at output position 0; the row would have no token left")


def test_a_ban_after_the_choices_that_masks_every_first_token_is_refused() -> None:
    assert refusal([CHOICES, {"kind": "banned_tokens", "token_ids": [7, 5, 6]}]).startswith(
        "dynamo_logits[1]: contradicts the entries before it: it masks every token dynamo_logits[0] leaves allowed at "
        "output position 0")


@pytest.mark.parametrize("other", [{"kind": "forced_sequence", "token_ids": [9], "eos_token_id": 2},
                                   {"kind": "allowed_tokens", "token_ids": [8, 9], "eos_token_id": 2}])
def test_a_first_token_forced_or_allowed_outside_the_choices_is_refused_in_either_order(other: dict[str, Any]) -> None:
    first, second = refusal([other, CHOICES]), refusal([CHOICES, other])
    assert first.startswith("dynamo_logits[1]: ") and "dynamo_logits[0] leaves allowed at output position 0" in first
    assert second.startswith("dynamo_logits[1]: ") and "dynamo_logits[0]" in second and "output position 0" in second


@pytest.mark.parametrize("payload", [
    [{"kind": "banned_tokens", "token_ids": [5]}, CHOICES],  # choice [7] is left
    [CHOICES, {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}],  # writes a choice
    [{"kind": "banned_tokens", "token_ids": [5, 6]}, CHOICES],  # the output never starts [5]: [6] is never due
    [{"kind": "multiple_choice", "texts": ["yes"]}, {"kind": "banned_tokens", "token_ids": [5, 7]}],  # unresolved
    [{"kind": "min_tokens", "min_tokens": 1, "stop_token_ids": [2]}, CHOICES],  # EOS free from position 1
    [{**CHOICES, "eos_token_id": None}, {"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [2]}],  # EOS unknown
], ids=["one choice left", "forced choice", "branch never entered", "texts", "eos after min_tokens", "eos not named"])
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
    assert "at output position 0" in refusal([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [5, 7]}])
    assert "at answer position 0" in refusal([REASONING, {"kind": "banned_tokens", "token_ids": [5, 7], "scope": "answer"},
                                               scoped])


@pytest.mark.parametrize("order", ["ban first", "choices first"])
def test_a_ban_on_a_later_token_of_a_choice_is_refused_in_either_order(order: str) -> None:
    ban = {"kind": "banned_tokens", "token_ids": [6]}
    got = refusal([ban, CHOICES] if order == "ban first" else [CHOICES, ban])
    assert got.startswith("dynamo_logits[1]: contradicts the entries before it: it ")
    assert "after the output [5] at output position 1; the row would have no token left" in got or (
        "after [5], which earlier entries mask at output position 1" in got)


@pytest.mark.parametrize("min_tokens", [{"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [2]},
                                        {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [2]}])
def test_min_tokens_holding_eos_past_a_whole_choice_is_refused(min_tokens: dict[str, Any]) -> None:
    assert refusal([min_tokens, CHOICES]) == (
        "dynamo_logits[1]: contradicts the entries before it: it allows only EOS after the whole choice [7], which "
        "earlier entries mask at output position 1; the row would have no token left")


def test_a_forced_sequence_that_leaves_the_choices_after_their_first_token_is_refused() -> None:
    got = refusal([CHOICES, {"kind": "forced_sequence", "token_ids": [5, 9], "eos_token_id": 2}])
    assert got == ("dynamo_logits[1]: contradicts the entries before it: it allows none of the tokens dynamo_logits[0] "
                   "leaves allowed after the output [5] at output position 1; the row would have no token left")


def test_a_banned_phrase_that_a_choice_must_write_is_refused() -> None:
    phrase = {"kind": "banned_phrases", "phrases": [[5, 6]]}
    assert "after [5], which earlier entries mask at output position 1" in refusal([phrase, CHOICES])
    decode_wire_payload([{"kind": "banned_phrases", "phrases": [[5, 9]]}, CHOICES])  # a phrase no choice writes


def test_a_banned_phrase_a_choice_must_write_is_refused_behind_an_allowed_set() -> None:
    allowed = {"kind": "allowed_tokens", "token_ids": [5, 6, 9], "eos_token_id": 2}
    phrase = {"kind": "banned_phrases", "phrases": [[5, 6]]}
    choices = {"kind": "multiple_choice", "choices": [[5, 6]], "eos_token_id": 2}
    assert refusal([allowed, phrase, choices]) == (
        "dynamo_logits[2]: contradicts the entries before it: it allows only the next tokens of its choices after "
        "[5], which earlier entries mask at output position 1; the row would have no token left")
    assert fails_writing([allowed, phrase, choices], [5, 6])


def test_a_banned_phrase_of_a_scoped_choices_scope_is_followed_on_its_stretch() -> None:
    scoped = {**CHOICES, "scope": "answer"}
    phrase = {"kind": "banned_phrases", "phrases": [[5, 6]], "scope": "answer"}
    assert "at answer position 1" in refusal([REASONING, scoped, phrase])
    assert fails_writing([REASONING, scoped, phrase], [5, 6])  # the answer from the first token on
    # an always phrase may begin before the answer does: not followed beside a scoped choice
    decode_wire_payload([REASONING, scoped, {**phrase, "scope": "always"}])


def test_a_scoped_choice_meets_its_scopes_entries_and_position_free_masks_only() -> None:
    scoped = {**CHOICES, "scope": "answer"}
    assert "at answer position 1" in refusal([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [6]}])
    assert "at answer position 1" in refusal([REASONING, scoped,
                                               {"kind": "banned_tokens", "token_ids": [6], "scope": "answer"}])
    decode_wire_payload([REASONING, scoped, {"kind": "banned_tokens", "token_ids": [6], "scope": "reasoning"}])
    # positions of the whole output say nothing about where the answer starts: not followed
    decode_wire_payload([REASONING, scoped, {"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [2]}])


def test_the_walk_follows_a_choice_to_its_end_and_only_reached_prefixes() -> None:
    long = {"kind": "multiple_choice", "choices": [[5, *range(100, 140)], [7, *range(200, 240)]], "eos_token_id": 2}
    assert "after the output [5, 100, 101, 102, ..., 137, 138] (40 tokens) at output position 40" in refusal(
        [long, {"kind": "banned_tokens", "token_ids": [139]}])
    decode_wire_payload([{"kind": "banned_tokens", "token_ids": [5]}, long, {"kind": "banned_tokens", "token_ids": [139]}])


TRIGGER = {"kind": "trigger", "trigger_token_ids": [30, 31], "phrase_token_ids": [40, 41]}


def test_a_trigger_a_choice_writes_must_go_on_with_its_phrase_in_either_order() -> None:
    choices = {"kind": "multiple_choice", "choices": [[5, 30, 31, 50], [6]], "eos_token_id": 2}
    assert refusal([choices, TRIGGER]) == (
        "dynamo_logits[1]: contradicts the entries before it: it forces token 40 (phrase_token_ids[0]) after the "
        "output [5, 30, 31] once its trigger is written at output positions 1..2, which dynamo_logits[0] does not "
        "allow; the row would have no token left")
    assert refusal([TRIGGER, choices]) == (
        "dynamo_logits[1]: contradicts the entries before it: it does not allow token 40 after the output "
        "[5, 30, 31], which dynamo_logits[0] forces (its phrase_token_ids[0]) once its trigger is written at output "
        "positions 1..2; the row would have no token left")
    whole = {"kind": "multiple_choice", "choices": [[5, 30, 31]], "eos_token_id": 2}  # only EOS after it
    assert "it forces token 40 (phrase_token_ids[0]) after the output [5, 30, 31]" in refusal([whole, TRIGGER])
    ban = {"kind": "banned_tokens", "token_ids": [40]}
    assert "dynamo_logits[2]: contradicts the entries before it: it forces token 40 (phrase_token_ids[0]) at output " \
           "position 3 once its trigger is written at output positions 1..2, which dynamo_logits[0] masks" in refusal(
               [ban, {**choices, "choices": [[5, 30, 31, 40, 41], [5, 30, 31, 50]]}, TRIGGER])
    decode_wire_payload([ban, {**choices, "choices": [[5, 30, 31, 40, 41], [5, 30, 31, 50]]}])  # the trigger's doing


def test_a_trigger_the_choices_never_write_is_admitted_beside_a_ban_on_its_phrase() -> None:
    decode_wire_payload([{"kind": "multiple_choice", "choices": [[5, 6], [30, 7]], "eos_token_id": 2}, TRIGGER,
                         {"kind": "banned_tokens", "token_ids": [41]}])
    decode_wire_payload([{"kind": "multiple_choice", "choices": [[5, 30, 31, 40, 41], [6]], "eos_token_id": 2}, TRIGGER])
    # after a whole choice whose EOS is the request's stop token (not known here), the phrase may be it
    decode_wire_payload([{"kind": "multiple_choice", "choices": [[5, 30, 31]]}, TRIGGER])


@pytest.mark.parametrize("choices, output, fails", [
    ([[5, 30, 31, 50], [6]], [5, 30, 31, 50], True),
    ([[5, 30, 31]], [5, 30, 31, 2], True),
    ([[5, 30, 31, 40, 41], [6]], [5, 30, 31, 40, 41, 2], False),
])
def test_the_realized_processors_fail_exactly_where_admission_refuses(choices: list[list[int]], output: list[int],
                                                                       fails: bool) -> None:
    payload = [{"kind": "multiple_choice", "choices": choices, "eos_token_id": 2}, TRIGGER]
    assert admitted(payload) != fails
    assert fails_writing(payload, output) == fails  # the output the choices let the request write


def _leaves_a_row_empty(payload: list[dict[str, Any]]) -> bool:
    """Brute force: whether some output the entries let a request write reaches a step whose row
    has no token (every prefix of the choices followed, ``row_left`` at each)."""
    eos = next(e for e in payload if e["kind"] == "multiple_choice")["eos_token_id"]
    outputs: list[tuple[int, ...]] = [()]
    while outputs:
        written = outputs.pop()
        allowed, _ = row_left(payload, written)
        assert allowed is not None  # the choices restrict every row
        if not allowed:
            return True
        outputs += [(*written, t) for t in allowed if t != eos]
    return False


def _random_payload(rng: random.Random) -> list[dict[str, Any]]:
    tokens = range(3, 9)
    choices = sorted({tuple(rng.choices(tokens, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 4))})
    payload: list[dict[str, Any]] = [{"kind": "multiple_choice", "choices": [list(c) for c in choices], "eos_token_id": 2}]
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["banned_tokens", "allowed_tokens", "min_tokens"])
        ids = rng.sample(range(2, 9), rng.randint(4, 6) if kind == "allowed_tokens" else rng.randint(1, 2))
        payload.append({"kind": "banned_tokens", "token_ids": ids} if kind == "banned_tokens" else
                       {"kind": "allowed_tokens", "token_ids": ids, "eos_token_id": rng.choice([2, 9])}
                       if kind == "allowed_tokens" else
                       {"kind": "min_tokens", "min_tokens": rng.randint(1, 4), "stop_token_ids": ids})
    rng.shuffle(payload)
    return payload


def test_admission_refuses_exactly_the_payloads_whose_choices_can_reach_an_empty_row() -> None:
    rng, refused, later = random.Random(35), 0, 0
    for _ in range(600):
        payload = _random_payload(rng)
        try:
            decode_wire_payload(payload)
            admitted = True
        except SpecError as err:
            admitted, refused, later = False, refused + 1, later + ("output position 0" not in str(err))
        assert admitted != _leaves_a_row_empty(payload), payload
    assert 150 < refused < 450 and later > 100  # both verdicts, and refusals past the first position


def test_admission_follows_a_trigger_down_the_choices_exactly() -> None:
    rng, refused, by_trigger = random.Random(36), 0, 0
    for _ in range(600):
        payload = _random_payload(rng)
        cue = rng.choices(range(3, 9), k=rng.randint(1, 2))
        payload.insert(rng.randint(0, len(payload)), {"kind": "trigger", "trigger_token_ids": cue,
                                                      "phrase_token_ids": rng.choices(range(2, 9), k=rng.randint(1, 2))})
        try:
            decode_wire_payload(payload)
            admitted = True
        except SpecError as err:
            admitted, refused, by_trigger = False, refused + 1, by_trigger + ("phrase_token_ids" in str(err))
        assert admitted != _leaves_a_row_empty(payload), payload
    assert 150 < refused < 500 and by_trigger > 30  # both verdicts, and refusals the trigger's phrase makes


def _beside_the_choices(rng: random.Random, payload: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payload`` with one to three of: a ``banned_phrases`` (one phrase a choice writes, one at
    random), a ``forced_sequence`` (mostly a choice, else one token short or one too many), a
    ``trigger``; each inserted at a random place."""
    (choice,) = [e for e in payload if e["kind"] == "multiple_choice"]
    for extra in rng.sample(["phrases", "forced", "trigger"], rng.randint(1, 3)):
        written = list(rng.choice(choice["choices"]))
        if extra == "phrases":
            entry = {"kind": "banned_phrases", "phrases": [written[rng.randrange(len(written)):][:rng.randint(1, 2)],
                                                           rng.choices(range(3, 9), k=rng.randint(1, 3))]}
        elif extra == "forced":
            cut = rng.random()
            entry = {"kind": "forced_sequence", "eos_token_id": 2 if rng.random() < 0.8 else 9,
                     "token_ids": written[:max(1, len(written) - 1)] if cut < 0.25 else
                     [*written, rng.randint(3, 8)] if cut < 0.4 else written}
        else:
            entry = {"kind": "trigger", "trigger_token_ids": rng.choices(range(3, 9), k=rng.randint(1, 2)),
                     "phrase_token_ids": rng.choices(range(2, 9), k=rng.randint(1, 2))}
        payload.insert(rng.randint(0, len(payload)), entry)
    return payload


@pytest.mark.parametrize("scope", ["always", "answer"])
def test_admission_follows_every_kind_beside_the_choices_exactly(scope: str) -> None:
    """Banned phrases, forced sequences and triggers beside the choices and the masks, all entries
    of one scope (``answer``: with reasoning delimiters the output never writes, so the answer's
    stretch is the whole output and each entry reads it from its start)."""
    rng, refused = random.Random(39), 0
    admitted_with: dict[str, int] = {"banned_phrases": 0, "forced_sequence": 0, "trigger": 0}
    for _ in range(600):
        payload = _beside_the_choices(rng, _random_payload(rng))
        if scope != "always":
            payload = [REASONING, *({**e, "scope": scope} for e in payload)]
        try:
            decode_wire_payload(payload)
            admitted = True
        except SpecError:
            admitted, refused = False, refused + 1
        for kind in admitted_with:
            admitted_with[kind] += admitted and any(e["kind"] == kind for e in payload)
        assert admitted != _leaves_a_row_empty(payload), payload
    assert 400 < refused < 570 and min(admitted_with.values()) > 15, admitted_with  # both verdicts, with each kind
