"""``no_repeat_ngram`` on vLLM's V1 runner on the CPU: float32 logits with at most
``HOST_WRITES_MAX`` ids to mask are written ``-inf`` one by one through a view of their memory,
others (more ids, other dtypes) by one ``index_fill_``; either way every row equals its hosted
twin bit for bit, and the rows around it are left alone."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from zoo_rows import V, realize

from dynlogits import sdk
from dynlogits.processors import no_repeat_ngram
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("most", [0, 3, no_repeat_ngram.HOST_WRITES_MAX])  # index_fill_ always, past a few ids, the default
def test_the_v1_runners_cpu_rows_equal_the_hosted_rows_by_either_write(monkeypatch: pytest.MonkeyPatch,
                                                                        dtype: torch.dtype, most: int) -> None:
    monkeypatch.setattr(no_repeat_ngram, "HOST_WRITES_MAX", most)
    rng = random.Random(most)
    slots = 6
    batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
    payloads = [[{"kind": "no_repeat_ngram", "size": rng.choice([1, 2, 3])}] for _ in range(slots)]
    for slot, payload in enumerate(payloads):
        assert batch.assign(slot, realize(payload))
    hosted = [realize(payload) for payload in payloads]
    lists: list[list[int]] = [[rng.randrange(V) for _ in range(rng.randint(0, 4))] for _ in range(slots)]
    batch.flush()
    order = [*rng.sample(range(slots), slots), -1]  # and a row without a payload
    batch.set_rows(np.array(order))
    masked = 0
    for step in range(30):
        logits = (torch.randn(len(order), V, generator=torch.Generator().manual_seed(step)) * 4).to(dtype)
        resident, want = logits.clone(), logits.clone()
        batch.apply(resident, EngineStep(histories=[*(lists[s] for s in order[:-1]), []]))
        sdk.apply_rows(want, list(range(slots)), [hosted[s] for s in order[:-1]], [lists[s] for s in order[:-1]])
        assert torch.equal(resident.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           want.view(torch.int16 if dtype != torch.float32 else torch.int32)), step
        assert torch.equal(resident[-1], logits[-1])
        masked += int(torch.isneginf(want).sum())
        for s in order[:-1]:  # the live lists grow by one: the steady step
            lists[s].append(rng.randrange(V))
    assert masked >= 100  # the premise: many ids masked, more than a few a step
