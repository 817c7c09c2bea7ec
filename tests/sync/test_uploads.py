"""``StepUpload`` on the CUDA model: a ring that grew while the device lagged, then had to widen,
keeps working, never waits, and every upload carries its own values."""

from __future__ import annotations

import torch

from dynlogits.processors.uploads import StepUpload
from dynlogits.testing.cuda.simcuda import SimCuda


def test_a_grown_ring_that_must_widen_keeps_uploading_without_waiting() -> None:
    with SimCuda() as sim:
        ring = StepUpload(torch.long, sim.device, capacity=4, ring=2)
        sent = []
        for n in (3, 3, 3, 3, 3, 3, 10, 3, 12):  # the device never catches up: the ring grows, then widens
            ring.buffer(n)[:] = range(len(sent), len(sent) + n)
            sent.append((list(range(len(sent), len(sent) + n)), ring.upload(n)))
        sim.advance()
        got = [sim.value(t).tolist() for _, t in sent]
    assert got == [want for want, _ in sent]
    assert sim.syncs == []


def test_a_cpu_upload_carries_the_values_just_written_also_after_the_buffer_grew() -> None:
    ring = StepUpload(torch.long, torch.device("cpu"), capacity=4)
    got = []
    for n, first in ((3, 0), (3, 10), (9, 20), (3, 40)):  # same count again; a growth; the old count after it
        ring.buffer(n)[:] = range(first, first + n)
        got.append(ring.upload(n).tolist())
    kept = ring.upload(3, keep=True)
    ring.buffer(3)[:] = [7, 7, 7]
    assert got == [[0, 1, 2], [10, 11, 12], list(range(20, 29)), [40, 41, 42]]
    assert kept.tolist() == [40, 41, 42]  # a kept upload is its own copy
