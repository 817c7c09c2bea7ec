"""``no_repeat_ngram`` on random token windows and, where there is one, a real CUDA device. Model
Runner V2's device decision (``no_repeat_ngram_device``) on random windows (placeholders, the prompt
counted or not, sizes 1 to 8 in one group, prefill chunks' rows, non-members, histories as long as
the engine's matrix, ids past the logits width) masks what transformers masks; on CUDA it gives the
CPU run's logits bit for bit and its steady step waits for the device nowhere
(``torch.cuda.set_sync_debug_mode("error")``), and so does the V1 runner's host decision
(``NoRepeatNgramGroup``, uploaded and masked) through ``SlotBatch`` (skipped without CUDA)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.no_repeat_ngram import banned_after
from dynlogits.processors.no_repeat_ngram_device import apply, layout, slot_tables, window_width
from dynlogits.processors.window import TokenWindow
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

CUDA = torch.cuda.is_available()
DEVICES = ("cpu", "cuda") if CUDA else ("cpu",)

V = 8  # the logits' width: ids 8 and 9 are history tokens no logit has


def _extremes(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(float("-inf"), device=device), torch.tensor(float("inf"), device=device)


@contextmanager
def _no_sync(device: str, on: bool = True) -> Iterator[None]:
    """Any synchronizing CUDA call in the block raises (on a CUDA ``device``, when ``on``)."""
    if device != "cuda" or not on:
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("seed", range(12))
def test_the_device_decision_masks_what_transformers_masks_and_on_cuda_the_same_without_a_sync(seed: int) -> None:
    rng = random.Random(seed)
    n, length, rows = 8, 40, 24
    matrix = [[rng.choice([2, 3, 4, 5, 9]) if rng.random() > 0.03 else -1 for _ in range(length)] for _ in range(n)]
    prompt_len = [rng.randint(1, 12) for _ in range(n)]
    member = [rng.random() < 0.85 for _ in range(n)]
    params = [[rng.randint(1, 8), int(rng.random() < 0.5)] for _ in range(n)]
    size = max(p[0] for p, m in zip(params, member) if m)
    slot_of_row = [rng.randrange(n) for _ in range(rows)]
    pos = [rng.randint(max(prompt_len[s] - 3, 0), length - 1) for s in slot_of_row]
    got = {}
    for device in DEVICES:
        window = TokenWindow(device).at(torch.tensor(matrix, dtype=torch.int32, device=device),
                                        torch.tensor(prompt_len, dtype=torch.int32, device=device),
                                        torch.tensor(pos, device=device))
        tables = slot_tables(window, torch.tensor(member, device=device), torch.tensor(params, device=device),
                             window_width(length, [None], size), size, V)
        t = layout(tables, torch.tensor(slot_of_row, device=device))
        extremes = _extremes(device)
        logits = torch.zeros(rows, V, device=device)
        apply(window, t, logits, extremes)  # the layout's first step
        logits = torch.zeros(rows, V, device=device)
        with _no_sync(device):
            apply(window, t, logits, extremes)  # a steady step
        got[device] = logits.cpu()
    assert all(torch.equal(got["cpu"], logits) for logits in got.values())
    for row, (slot, p) in enumerate(zip(slot_of_row, pos)):
        want: list[int] = []
        if member[slot] and p >= prompt_len[slot] - 1:  # else not the group's, or a prefill chunk's row
            history = matrix[slot][0 if params[slot][1] else prompt_len[slot]:p + 1]
            want = sorted(i for i in banned_after(history, params[slot][0]) if i < V)
        assert torch.isneginf(got["cpu"][row]).nonzero().flatten().tolist() == want, (row, slot, p)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_the_v1_runners_step_on_cuda_equals_the_cpu_run_and_never_syncs() -> None:
    rng = random.Random(5)
    payloads = [[{"kind": "no_repeat_ngram", "size": s, "include_prompt": s % 2 == 0}] for s in (1, 2, 3, 4)]
    batches = {}
    for device in ("cpu", "cuda"):
        batch = SlotBatch(num_slots=4, vocab_size=V, device=device, host_histories=True)
        for slot, payload in enumerate(payloads):
            request = sdk.realize(payload, vocab_size=V, stop_token_id=1, facts=sdk.RequestFacts(prompt_ids=(2, 3, 2)))
            assert request is not None and batch.assign(slot, request)
        batch.flush()
        batch.set_rows(np.array([2, 0, 3, 1]))
        batches[device] = batch
    histories = [[rng.randrange(2, 6) for _ in range(rng.randint(0, 4))] for _ in range(4)]
    rows = [histories[s] for s in (2, 0, 3, 1)]
    masked = 0
    for step in range(40):
        out = {}
        for device, batch in batches.items():
            logits = torch.zeros(4, V, device=device)
            with _no_sync(device, on=step > 2):
                batch.apply(logits, EngineStep(histories=rows))
            out[device] = logits.cpu()
        assert torch.equal(out["cpu"], out["cuda"]), step
        masked += int(torch.isneginf(out["cpu"]).sum())
        for h in histories:
            h.append(rng.randrange(2, 6))
    assert masked > 40
