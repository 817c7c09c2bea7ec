"""Admission of ``thinking_budget`` where its end tokens meet other entries: refused exactly where
the realized processors would leave a row with no token or act where admission assumes they
never do (issue 47's two gaps: a budget scoped to the answer on the reasoning delimiters, and a
phrase ban on the end tag)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spec_refusals import admitted, fails_writing, refusal

from dynlogits import sdk
from dynlogits.sdk.realization import RequestFacts
from dynlogits.specs import decode_wire_payload

REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}
ANSWER_BUDGET = {"kind": "thinking_budget", "budget": 2, "scope": "answer"}


def _allowed_after(payload: list[dict[str, Any]], prompt: list[int], output: list[int]) -> list[int] | None:
    """The ids the realized processors leave after ``output`` (``None``: every id), the prompt given."""
    request = sdk.realize(payload, vocab_size=64, stop_token_id=2, facts=RequestFacts(prompt_ids=prompt, stop_token_ids=(2,)))
    assert request is not None
    row = sdk.apply_row(request, output, torch.zeros(64))
    left = torch.isfinite(row).nonzero().flatten().tolist()
    return None if len(left) == 64 else left


@pytest.mark.parametrize("budget", [ANSWER_BUDGET, {**ANSWER_BUDGET, "start_token_ids": [20], "end_token_ids": [21]}],
                         ids=["the request's delimiters", "its own, the same"])
def test_a_budget_on_the_reasoning_delimiters_scoped_to_the_answer_is_refused_naming_its_scope(
        budget: dict[str, Any]) -> None:
    assert refusal([REASONING, budget]) == (
        "dynamo_logits[1].scope: a thinking_budget on the reasoning delimiters cannot be scoped to answer: the "
        "reasoning span is never open in the answer, yet a span the prompt opened would be counted there and its end "
        "token forced into the answer; scope it reasoning or always")


def test_the_answer_ban_on_the_end_tag_beside_it_is_refused_where_it_was_admitted_and_failed_at_run_time() -> None:
    assert refusal([REASONING, ANSWER_BUDGET, {"kind": "banned_tokens", "token_ids": [21], "scope": "answer"}]) \
        .startswith("dynamo_logits[1].scope: ")


def test_why_such_a_budget_is_refused_it_forces_the_end_tag_into_the_answer_when_the_prompt_opened_the_span() -> None:
    """The realized processor (checks left out): the prompt opens a span the output closes at once;
    two answer tokens later the budget, counting the prompt's span as open, forces ``</think>``."""
    from unittest import mock

    from dynlogits.sdk import realization

    with mock.patch.object(realization, "finish_entries", lambda entries, **_: entries):
        assert _allowed_after([REASONING, ANSWER_BUDGET], [1, 20], [5, 21, 6, 7]) == [21]
        assert _allowed_after([REASONING, {**ANSWER_BUDGET, "scope": "reasoning"}], [1, 20], [5, 21, 6, 7]) is None


@pytest.mark.parametrize("scope", ["reasoning", "always"])
def test_a_budget_on_the_reasoning_delimiters_scoped_where_the_span_is_open_is_admitted(scope: str) -> None:
    decode_wire_payload([REASONING, {**ANSWER_BUDGET, "scope": scope}])


def test_a_budget_scoped_to_the_answer_on_other_delimiters_is_admitted() -> None:
    decode_wire_payload([REASONING, {**ANSWER_BUDGET, "start_token_ids": [30], "end_token_ids": [31]}])


@pytest.mark.parametrize("ban", [{"kind": "banned_tokens", "token_ids": [21]},
                                 {"kind": "banned_phrases", "phrases": [[7, 8], [21]]}], ids=["ids", "one-token phrase"])
def test_a_phrase_ban_on_the_one_token_end_tag_is_refused_as_the_id_ban_is(ban: dict[str, Any]) -> None:
    budget = {"kind": "thinking_budget", "budget": 0}
    got = refusal([REASONING, budget, ban])
    assert got.startswith("dynamo_logits[1].end_token_ids: token 21 is banned by dynamo_logits[2]")
    assert got.endswith("so closing a thinking span would leave the row with no token")
    assert fails_writing([REASONING, budget, ban], [20, 21])


def test_a_phrase_ban_on_a_multi_token_end_tag_is_refused_naming_the_phrase() -> None:
    payload = [{"kind": "thinking_budget", "budget": 0, "start_token_ids": [30], "end_token_ids": [31, 32]},
               {"kind": "banned_phrases", "phrases": [[5], [31, 32]]}]
    assert refusal(payload) == (
        "dynamo_logits[0].end_token_ids: the end tokens hold dynamo_logits[1].phrases[1], whose last token 32 the ban "
        "masks once the rest is written, so closing a thinking span would leave the row with no token")
    assert fails_writing(payload, [30, 31, 32])


def test_a_phrase_ban_that_never_acts_where_the_span_closes_is_admitted() -> None:
    assert admitted([REASONING, {"kind": "thinking_budget", "budget": 2},
                     {"kind": "banned_phrases", "phrases": [[21]], "scope": "answer"}])
    assert admitted([REASONING, {"kind": "thinking_budget", "budget": 2}, {"kind": "banned_phrases", "phrases": [[21, 5]]}])
