"""``banned_phrases`` decided on the host (vLLM's V1 runner: the adapter passes the histories) writes
host logits of every float dtype as the hosted path does, bit for bit: numpy's dtypes through the
logits' memory (``BannedPhrasesGroup._write_host``), bfloat16 by the torch write; on steps that find
ids beyond the one-token phrases and on steps that find none; NaN and infinite logits included."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from zoo_rows import V, realize

from dynlogits import sdk
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

#: one-token phrases, prefixes of one token, of several tokens sharing their last (the walk's dict)
#: and a chain of one token before each (no dict)
PHRASES = [[9], [4], [5, 6], [3, 5, 7], [2, 5, 8], [2, 3, 4, 10], [6, 6, 6, 6, 11]]


def _logits(rows: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    made = torch.randn(rows, V, generator=generator).to(dtype)
    made[0, 3] = float("nan")
    made[-1, 6] = float("inf")
    made[-1, 5] = float("-inf")
    return made


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_host_decided_rows_equal_the_hosted_path_in_every_float_dtype(dtype: torch.dtype) -> None:
    rng = random.Random(str(dtype))
    generator = torch.Generator().manual_seed(7)
    slots = 4
    batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
    payload = [{"kind": "banned_phrases", "phrases": PHRASES}]
    host = {slot: realize(payload) for slot in range(slots)}
    for slot in range(slots):
        assert batch.assign(slot, realize(payload))
    batch.flush()
    histories: dict[int, list[int]] = {slot: [] for slot in range(slots)}
    found_steps = quiet_steps = 0
    for step in range(40):
        order = rng.sample(range(slots), rng.randint(1, slots))
        batch.set_rows(np.array(order))
        logits = _logits(len(order), dtype, generator)
        resident, hosted = logits.clone(), logits.clone()
        batch.apply(resident, EngineStep(histories=[histories[s] for s in order]))
        sdk.apply_rows(hosted, list(range(len(order))), [host[s] for s in order], [histories[s] for s in order])
        assert torch.equal(resident.isnan(), hosted.isnan()), step
        assert torch.equal(resident.masked_fill(resident.isnan(), 0.0), hosted.masked_fill(hosted.isnan(), 0.0)), step
        masked = int(torch.isneginf(hosted).sum()) - int(torch.isneginf(logits).sum())
        beyond_one_token = masked > 2 * len(order)  # each row's 4 and 9, then the walk's
        found_steps += beyond_one_token
        quiet_steps += not beyond_one_token
        for slot in order:  # outputs that write the phrases' prefixes, or a stray token
            phrase = rng.choice(PHRASES[2:])
            histories[slot] += phrase[:-1] if rng.random() < 0.6 else [rng.randrange(2, 12)]
    assert found_steps >= 10 and quiet_steps >= 1  # the premise: both kinds of step were met
