"""A ``SlotBatch`` warms the fused kernels for its own logits width (``warm(device, vocab)``: the
variants that width selects are compiled at load, not in a request's first step)."""

from __future__ import annotations

import pytest
import torch

from dynlogits.sdk.resident import slot_batch
from dynlogits.sdk.resident.slot_batch import SlotBatch


def test_a_slot_batch_warms_the_kernels_for_its_own_logits_width(monkeypatch: pytest.MonkeyPatch) -> None:
    warmed: list[tuple[object, ...]] = []
    monkeypatch.setattr(slot_batch, "warm", lambda *args: warmed.append(args))
    SlotBatch(num_slots=2, vocab_size=1234, device="cpu")
    assert warmed == [(torch.device("cpu"), 1234)]
