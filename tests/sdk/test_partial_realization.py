"""An entry that cannot be realized for its request never drops the others (issue 47, item 3):
the request is reported failed, fail-stopped where it has a stop token, and where it has none
(``ignore_eos`` without stop ids: nothing can end it) the entries that realized, the deployment's
among them, keep applying."""

from __future__ import annotations

import math

import pytest
import torch

from dynlogits import sdk
from dynlogits.sdk.realization import RequestFacts, build_request_processor
from dynlogits.specs import SpecError

VOCAB = 64
BAN = {"kind": "banned_tokens", "token_ids": [7, 9]}  # the deployment's
DEADLINE = {"kind": "deadline", "seconds": 30.0}  # needs the request's stop token
CHOICE_IDS = {"kind": "multiple_choice", "choices": [[3, 4], [5]]}  # so does this one (no eos_token_id)


def _row(request: sdk.GuardedRequest, history: list[int] | None = None) -> torch.Tensor:
    row = torch.zeros(VOCAB)
    sdk.apply_row(request, history or [], row)
    return row


def test_without_a_stop_token_the_entries_that_realize_keep_applying_and_the_failure_is_reported() -> None:
    reports: list[str] = []
    request = sdk.realize([BAN, DEADLINE], vocab_size=VOCAB, stop_token_id=None, report=reports.append)
    assert request is not None and not request.failed  # nothing could end it: it runs on, held by the ban
    for history in ([], [1, 2, 3]):
        row = _row(request, history)
        assert row[7] == -math.inf and row[9] == -math.inf and torch.isfinite(row).sum() == VOCAB - 2
    (report,) = reports
    assert "dynamo_logits[1]: could not realize kind 'deadline'" in report
    assert "continues with the entries that were realized" in report


def test_an_entry_failing_at_set_up_with_a_stop_token_ends_the_request() -> None:
    reports: list[str] = []
    factory_fails = [BAN, {"kind": "prompt_tokens", "mode": "boost"}]  # no prompt given: its factory raises
    request = sdk.realize(factory_fails, vocab_size=VOCAB, stop_token_id=2, report=reports.append)
    assert request is not None and request.failed
    row = _row(request)
    assert row[2] == 0.0 and torch.isfinite(row).sum() == 1
    assert len(reports) == 1 and "dynamo_logits[1]: could not realize kind 'prompt_tokens'" in reports[0]


def test_every_entry_is_tried_and_each_failing_one_is_named() -> None:
    with pytest.raises(SpecError) as info:
        build_request_processor([DEADLINE, BAN, CHOICE_IDS], vocab_size=VOCAB)
    assert [p.path for p in info.value.problems] == ["dynamo_logits[0]", "dynamo_logits[2]"]
    assert build_request_processor([DEADLINE, BAN, CHOICE_IDS], vocab_size=VOCAB,
                                   facts=RequestFacts(stop_token_ids=(2,))) is not None


def test_an_entry_realized_from_the_prompt_that_contradicts_the_others_leaves_them_applying() -> None:
    """A ``prompt_tokens`` restrict of a prompt made of banned ids only is an empty allowed set once
    realized: it is left out and reported; the ban still holds on a request with no stop token."""
    reports: list[str] = []
    payload = [BAN, {"kind": "prompt_tokens", "mode": "restrict"}]
    request = sdk.realize(payload, vocab_size=VOCAB, stop_token_id=None, report=reports.append,
                          facts=RequestFacts(prompt_ids=(7, 9)))
    assert request is not None and not request.failed
    row = _row(request)
    assert row[7] == -math.inf and row[9] == -math.inf and torch.isfinite(row).sum() == VOCAB - 2
    assert len(reports) == 1 and "dynamo_logits[1]" in reports[0] and "with this request's prompt" in reports[0]
