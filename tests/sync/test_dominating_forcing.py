"""Forcing by a dominating logit on the resident path, as a GPU runs it (``dynlogits.testing.simcuda``):
a batch mixing requests that dominate and requests that mask, with a later entry on some (the
unsettled path) and forced ids the engine masked (failures), picks the same winner in every row as
the host path (which always masks), writes only the forced (or stop) id of a dominating row,
reports the same failures, and never waits for the device."""

from __future__ import annotations

import math

import numpy as np
import torch

from dynlogits import sdk
from dynlogits.sdk.forcing import DOMINATING_LOGIT
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.testing.simcuda import SimCuda

V = 48
EOS = 1
SEQ = [10, 11, 12, 13]


def _payload(i: int) -> list[dict]:
    forced = [{"kind": "forced_sequence", "token_ids": [t + i for t in SEQ], "eos_token_id": EOS}]
    return forced + ([{"kind": "banned_tokens", "token_ids": [40 + i]}] if i % 3 == 2 else [])


def _requests(n: int, dominating: list[bool]) -> list[sdk.GuardedRequest]:
    out = []
    for i in range(n):
        request = sdk.realize(_payload(i), vocab_size=V, stop_token_id=EOS)
        assert request is not None
        request.dominating = dominating[i]
        out.append(request)
    return out


def test_mixed_dominating_and_masking_rows_pick_the_host_paths_winners_without_waiting() -> None:
    n, steps = 6, 5
    dominating = [i % 2 == 0 for i in range(n)]
    resident, host = _requests(n, dominating), _requests(n, [False] * n)
    gen = torch.Generator().manual_seed(0)
    histories: list[list[int]] = [[] for _ in range(n)]
    ended: set[int] = set()
    with SimCuda() as sim:
        batch = SlotBatch(num_slots=8, vocab_size=V, device=sim.device)
        order = [5, 0, 3, 1, 4, 2]  # rows interleave dominating and masking requests
        for slot, request in enumerate(resident):
            batch.assign(slot, request)
        batch.flush()
        batch.set_rows(np.array(order))
        for step in range(steps):
            raw = torch.randn(n, V, generator=gen)
            if step == 2:
                raw[1, SEQ[0] + order[1] + 2] = -math.inf  # the engine masks a dominating row's forced id
                raw[3, SEQ[0] + order[3] + 2] = -math.inf  # and a masking row's
            logits = sim.put(raw)
            batch.apply(logits, histories=[histories[slot] for slot in order])
            got = sim.value(logits)
            want = raw.clone()
            with sim.paused():
                sdk.apply_rows(want, list(range(n)), [host[slot] for slot in order], [histories[slot] for slot in order])
            for row, slot in enumerate(order):
                winner = int(want[row].argmax())
                histories[slot].append(winner)
                if slot in ended:
                    continue  # its stop token was sampled: the engine ends it (the resident path learns a step later)
                assert int(got[row].argmax()) == winner, (step, row)
                if dominating[slot]:
                    changed = set((got[row] != raw[row]).nonzero().flatten().tolist())
                    banned = {40 + slot} if slot % 3 == 2 else set()  # its own later entry
                    assert got[row, winner] == DOMINATING_LOGIT and changed - banned == {winner}, (step, row, changed)
                else:
                    assert torch.equal(got[row], want[row]), (step, row)
            ended |= {slot for slot in order if host[slot].failed}
            sim.advance()  # the device catches up between steps: the flags copy lands
    assert sim.syncs == []
    failed = [i for i, r in enumerate(resident) if r.failed]
    assert failed == [i for i, r in enumerate(host) if r.failed] == sorted([order[1], order[3]])
