"""``StepUpload`` on the CUDA model: a ring that grew while the device lagged, then had to widen,
keeps working, never waits, and every upload carries its own values."""

from __future__ import annotations

import torch

from dynlogits.testing.cuda.simcuda import SimCuda
from dynlogits.processors.uploads import StepUpload


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
