"""GuardedRequest.split: which of a request's entries a slot engine runs resident and which per row."""

from __future__ import annotations

import pytest
import torch

from dynlogits import sdk
from dynlogits.testing import plugin_kinds

VOCAB = 32
BAN = {"kind": "banned_tokens", "token_ids": [5]}
BIAS = {"kind": "logit_bias", "bias": {"7": 1.0}}
KEEP = {"kind": "kit.keep_only", "token_ids": [5, 6, 7, 1]}
RAISE = {"kind": "kit.raise_after", "after": 0}


def _request(*entries):
    with plugin_kinds.registered():
        request = sdk.realize(list(entries), vocab_size=VOCAB, stop_token_id=1)
    assert request is not None and not request.failed
    return request


def _kinds(part):
    return [type(p).__name__ for p in part.processor.processors]


def test_built_ins_alone_are_resident_whole():
    request = _request(BAN, BIAS)
    assert request.split() == (request, None)


def test_built_ins_then_plugin_entries_split_in_payload_order():
    request = _request(BAN, BIAS, KEEP)
    resident, hosted = request.split()
    assert resident.resident and not hosted.resident
    assert _kinds(resident) == ["BannedTokensProcessor", "LogitBiasProcessor"]
    assert _kinds(hosted) == ["KeepOnly", "_RowChecked"]  # then its whole row is checked


def test_a_row_the_per_row_part_empties_after_the_resident_part_restricted_it_fails_the_request():
    from dynlogits.processors.request import RequestLogitsProcessor
    from dynlogits.testing.faults import BanId

    allowed = _request({"kind": "allowed_tokens", "token_ids": [6]}).processor.processors[0]
    request = sdk.GuardedRequest(RequestLogitsProcessor([allowed, BanId(6)], vocab_size=VOCAB), stop_token_id=1)
    _, hosted = request.split()
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, 6] = 0.0  # what the resident allowed_tokens left
    sdk.apply_rows(logits, [0], [hosted], [[]])  # the plug-in's row op bans 6: nothing is left
    assert request.failed and "no token left to sample at output position 0" in request.error
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [1]  # fail-stopped to its stop token


@pytest.mark.parametrize("entries", [(KEEP,), (KEEP, BAN), (BAN, KEEP, BIAS)])
def test_a_built_in_after_a_plugin_entry_keeps_the_whole_request_per_row(entries):
    request = _request(*entries)
    assert request.split() == (None, request)


def test_the_parts_share_the_requests_failure_state():
    request = _request(BAN, RAISE)
    resident, hosted = request.split()
    logits = torch.zeros(1, VOCAB)
    sdk.apply_rows(logits, [0], [hosted], [[]])  # raised: the whole request failed, naming the processor by its index in it
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [1]  # fail-stopped to its stop token
    assert request.failed and resident.failed and hosted.failed
    assert request.failure.processor == 1 and resident.failure is request.failure
    assert resident.stop_token_id == request.stop_token_id == 1
    assert resident.plan([]) is None
