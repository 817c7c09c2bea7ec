"""The resident path and the host-planned path agree where the issue found them apart (an empty
row checked after every entry, NaN forced logits, the logits width), a failed request without a
stop token does not re-lay out the batch at every flags read, and ``thinking_budget`` tables go
once their last request left."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.testing.cuda.simcuda import SimCuda

V = 32
EOS = 1


def _realize(payload: list[dict], stop: int | None = EOS) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=V, stop_token_id=stop)
    assert request is not None
    return request


def _both(payload: list[dict], logits: torch.Tensor, history: list[int]) -> tuple[torch.Tensor, bool, torch.Tensor, bool]:
    """(resident logits, resident failed, host logits, host failed) for one row."""
    resident, host = _realize(payload), _realize(payload)
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    batch.assign(0, resident)
    batch.flush()
    batch.set_rows(np.array([0]))
    a, b = logits.clone(), logits.clone()
    batch.apply(a, EngineStep(histories=[history]))
    sdk.apply_rows(b, [0], [host], [history])
    return a, resident.failed, b, host.failed


def test_an_allowed_set_emptied_by_a_later_entry_fails_on_both_paths() -> None:
    """allowed {5, 6} + EOS, then banned {5}; the grammar masks 6 and EOS: no token is left."""
    payload = [{"kind": "allowed_tokens", "token_ids": [5, 6], "eos_token_id": EOS},
               {"kind": "banned_tokens", "token_ids": [5]}]
    logits = torch.randn(1, V)
    logits[0, [6, EOS]] = float("-inf")
    a, a_failed, b, b_failed = _both(payload, logits, [])
    assert a_failed and b_failed
    assert torch.equal(a, b)
    assert torch.isfinite(a[0]).nonzero().flatten().tolist() == [EOS]  # fail-stopped to its stop token


def test_a_nan_forced_logit_is_forced_alike_on_both_paths() -> None:
    payload = [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}]
    logits = torch.randn(1, V)
    logits[0, 5] = float("nan")
    a, a_failed, b, b_failed = _both(payload, logits, [])
    assert not a_failed and not b_failed
    assert torch.equal(a, b) and a[0, 5].item() == 0.0


def test_logits_of_another_width_are_refused_by_the_resident_path() -> None:
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    batch.assign(0, _realize([{"kind": "banned_tokens", "token_ids": [V - 1]}]))
    batch.flush()
    batch.set_rows(np.array([0, -1]))
    with pytest.raises(ValueError, match="width 32"):
        batch.apply(torch.randn(2, V - 4), EngineStep(histories=[[], []]))


def test_a_failed_request_without_a_stop_token_is_laid_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
    failing = _realize([{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}], stop=None)
    batch.assign(0, failing)
    batch.assign(1, _realize([{"kind": "forced_sequence", "token_ids": [7, 8, 9, 10], "eos_token_id": EOS}]))
    batch.flush()
    batch.set_rows(np.array([0, 1]))
    prepared: list[int] = []
    real = batch.listed.prepare
    monkeypatch.setattr(batch.listed, "prepare", lambda stride, dtype: (prepared.append(stride), real(stride, dtype)))
    logits = torch.randn(2, V)
    logits[0, 5] = float("-inf")
    batch.apply(logits, EngineStep(histories=[[], []]))
    assert failing.failed
    prepared.clear()
    for n in range(1, 4):
        batch.apply(torch.randn(2, V), EngineStep(histories=[[0] * n, [0] * n]))
    assert len(prepared) <= 1  # the failure's one re-layout, never one per step


def test_thinking_tables_go_with_their_last_request_and_steps_then_queue_nothing() -> None:
    thinking = DeviceThinking(5, "cpu")
    request = _realize([{"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21], "budget": 2}])
    thinking.assign(0, request)
    assert thinking.tables
    thinking.assign(0, None)
    assert thinking.tables == {}
    with SimCuda() as sim:
        tokens = sim.put(torch.zeros(4, 8, dtype=torch.int32))
        lengths = sim.put(torch.ones(4, dtype=torch.int32))
        thinking.step(tokens, lengths, lengths)
    assert sim.launches == 0 and sim.syncs == []
