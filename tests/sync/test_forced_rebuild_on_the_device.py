"""``forced_sequence``'s listed rebuild on the CUDA model (``dynlogits.testing.cuda.simcuda``): the
settle table the last group of a layout reads (``ForcedSequenceGroup._prepare_settle``) is built on
the host and reaches the device in one upload and one op; the steps that read it, planned by the
host or picked on the device from the runner's positions, force each row's token, and a row whose
forced token the model masks gets its stop token from then on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.forced_sequence import ForcedSequenceGroup
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.testing.cuda.simcuda import SimCuda

V = 48
EOS = 1
SEQUENCES = [[5, 6, 7], [11, 12, 13, 14, 15, 16, 17], [20]]
MASKED_AT = 2


def _request(tokens: list[int]) -> sdk.GuardedRequest:
    request = sdk.realize([{"kind": "forced_sequence", "token_ids": tokens, "eos_token_id": EOS}],
                          vocab_size=V, stop_token_id=EOS)
    assert request is not None
    return request


@pytest.mark.parametrize("source", ["histories", "pos"])  # the V1 runner's plan, Model Runner V2's positions
def test_a_forced_groups_rebuild_uploads_its_settle_table_in_two_device_ops(monkeypatch: pytest.MonkeyPatch,
                                                                            source: str) -> None:
    prepared: list[list[str]] = []
    real = ForcedSequenceGroup.prepare
    with SimCuda() as sim:
        def prepare(self, rows, stride):  # noqa: ANN001, ANN202
            before = len(sim.ops)
            real(self, rows, stride)
            prepared.append(sim.ops[before:])

        monkeypatch.setattr(ForcedSequenceGroup, "prepare", prepare)
        batch = SlotBatch(num_slots=5, vocab_size=V, device=sim.device)
        for slot, tokens in enumerate(SEQUENCES):
            batch.assign(slot + 1, _request(tokens))
        batch.set_rows(np.array([3, 1, 2]))  # rows hold slots out of order: member rows are 0..2
        offset = sim.put(torch.tensor([4, 9, 2]))
        forced = []
        for step in range(9):
            host = torch.randn(3, V)
            if step == MASKED_AT:  # the model masks row 1's forced token: fail-stopped from then on
                host[1, SEQUENCES[0][step]] = float("-inf")
            logits = sim.put(host)
            if source == "histories":
                batch.apply(logits, EngineStep(histories=[[EOS] * step] * 3))
            else:
                with sim.paused():
                    pos = sim.put(sim.value(offset) + step)
                batch.apply(logits, EngineStep(pos=pos, pos_offset=offset))
            with sim.paused():
                forced.append([torch.isfinite(row).nonzero().flatten().tolist() for row in sim.value(logits)])
            sim.advance()
        assert sim.syncs == []
    # each rebuild is the table's upload, then its stop plane: one at the start, and one more if the
    # failed row's report (read back off the step, ``dynlogits.sdk.readback``) lands within the steps
    assert 1 <= len(prepared) <= 2 and all(ops == ["copy_", "copy_"] for ops in prepared), prepared
    for step, rows in enumerate(forced):
        want = [[tokens[step] if step < len(tokens) else EOS] for tokens in (SEQUENCES[2], SEQUENCES[0], SEQUENCES[1])]
        if step >= MASKED_AT:
            want[1] = [EOS]
        assert rows == want, step
