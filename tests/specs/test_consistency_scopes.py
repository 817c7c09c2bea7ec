"""Admission knows scopes (``dynlogits.specs.consistency``): entries of phases that never meet cannot
contradict each other; entries that meet at some step still can, however their positions line up."""

from __future__ import annotations

from typing import Any

import pytest
from spec_refusals import refusal

from dynlogits.specs import decode_wire_payload
from dynlogits.specs.consistency import MIXED_POINTS, _grid

EOS = 2
REASONING = {"kind": "reasoning", "start_token_ids": [10], "end_token_ids": [11]}


def _forced(ids: list[int], **extra: Any) -> dict[str, Any]:
    return {"kind": "forced_sequence", "token_ids": ids, "eos_token_id": EOS, **extra}


def _ban(ids: list[int], **extra: Any) -> dict[str, Any]:
    return {"kind": "banned_tokens", "token_ids": ids, **extra}


def test_a_forced_sequence_scoped_to_the_answer_never_meets_a_ban_scoped_to_reasoning() -> None:
    decode_wire_payload([REASONING, _ban([5], scope="reasoning"), _forced([5, 6], scope="answer")])


@pytest.mark.parametrize("ban_scope", ["always", "answer"])
def test_a_forced_sequence_scoped_to_the_answer_contradicts_a_ban_acting_in_the_answer(ban_scope: str) -> None:
    message = refusal([REASONING, _ban([5], scope=ban_scope), _forced([5, 6], scope="answer")])
    assert message.startswith("dynamo_logits[2]: contradicts the entries before it: it forces token 5 at ")
    assert "which an earlier entry masks" in message


def test_without_reasoning_delimiters_an_entry_scoped_to_reasoning_never_acts() -> None:
    decode_wire_payload([_ban([5], scope="reasoning"), _forced([5, 6])])
    assert "forces token 5 at answer position 0" in refusal([_ban([5], scope="answer"), _forced([5], scope="answer")])


def test_positions_of_the_two_scales_are_paired_wherever_the_phase_can_begin() -> None:
    """An always forced [5, 6] and an answer-scoped allowed set {5}: the answer may begin at output
    position 1, where 6 is forced; refused, naming both positions' scale."""
    message = refusal([REASONING, _forced([5, 6]), {"kind": "allowed_tokens", "token_ids": [5], "eos_token_id": EOS,
                                                     "scope": "answer"}])
    assert message == ("dynamo_logits[2]: contradicts the entries before it: it allows none of the tokens "
                       "dynamo_logits[1] leaves allowed at answer position 0; the row would have no token left")
    # a phase position never runs ahead of the output position: a 2-token answer-scoped sequence
    # agreeing with the always one's first token is met at (1, 1) and (1, 0), never at (0, 1)
    message = refusal([REASONING, _forced([5], scope="answer"), _forced([5, 6])])
    assert "forces token 6 at output position 1, which dynamo_logits[1] does not allow" in message


def test_the_pairs_checked_are_bounded_whatever_the_sequences_lengths() -> None:
    entries = decode_wire_payload([_forced(list(range(20, 520))), _forced(list(range(20, 520)), scope="answer")][:1])
    scoped = decode_wire_payload([_forced(list(range(20, 520)), scope="answer")])
    grid = _grid([*entries, *scoped], [0, 1])
    assert len(grid) <= (MIXED_POINTS + 1) ** 2
    assert (500, 500) in grid and (0, 0) in grid and (0, 1) not in grid


def test_a_thinking_budget_without_delimiters_needs_the_payloads_reasoning_delimiters() -> None:
    budget = {"kind": "thinking_budget", "budget": 4}
    assert refusal([budget]) == ("dynamo_logits[0]: thinking_budget has no delimiters of its own (start/end) and the "
                                  "payload declares no reasoning delimiters (a reasoning entry, or the deployment's "
                                  "reasoning:)")
    decode_wire_payload([REASONING, budget])


def test_a_thinking_end_banned_only_in_the_answer_is_never_met_where_the_span_closes() -> None:
    """With the request's reasoning delimiters the span closes in the reasoning phase: a ban of its
    end token scoped to the answer cannot meet it; one acting in reasoning can, and so can any ban
    where the budget follows delimiters of its own (its spans may lie in either phase)."""
    budget = {"kind": "thinking_budget", "budget": 4}
    decode_wire_payload([REASONING, budget, _ban([11], scope="answer")])
    assert "token 11 is banned by dynamo_logits[2]" in refusal([REASONING, budget, _ban([11], scope="reasoning")])
    own = {"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21], "budget": 4}
    assert "token 21 is banned by dynamo_logits[2]" in refusal([REASONING, own, _ban([21], scope="answer")])


def test_min_tokens_masking_the_thinking_end_is_refused_even_after_the_budget() -> None:
    """A span the prompt opened counts its tokens, so the end can be due at the first generated token."""
    message = refusal([{"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21], "budget": 50},
                        {"kind": "min_tokens", "min_tokens": 3, "stop_token_ids": [21]}])
    assert message.startswith("dynamo_logits[0].end_token_ids: token 21 is masked by dynamo_logits[1] until output "
                              "position 3, and the span can be closed before that")
