"""Helpers shared by the tests of the zoo's kinds (``multiple_choice``, ``trigger``, ``deadline``,
``prompt_tokens``): a row with distinct finite logits, its finite ids, one processor call checked
to be in place, the largest allocation a call makes, and a request run on the resident path (a
``SlotBatch`` given the rows' histories, as vLLM's V1 runner does) beside its host-path twin."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dynlogits import sdk
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 64
EOS = 1


def logits_row(vocab: int = V) -> torch.Tensor:
    """A row of distinct finite logits (``id / 10``)."""
    return torch.arange(vocab, dtype=torch.float32) / 10


def finite(row: torch.Tensor) -> list[int]:
    """The ids whose logit is finite."""
    return torch.isfinite(row).nonzero().flatten().tolist()


def apply(processor: Any, ids: Sequence[int], vocab: int = V) -> torch.Tensor:
    """``processor(ids, row)`` on a fresh ``logits_row``; asserts it returns nothing and edits in place."""
    row = logits_row(vocab)
    ptr = row.data_ptr()
    assert processor(ids, row) is None
    assert row.data_ptr() == ptr, "processors must modify the row in place"
    return row


def largest_allocation(fn: Callable[[], None]) -> int:
    """The largest CPU allocation (bytes) ``fn`` makes, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def realize(payload: list[dict[str, Any]], facts: sdk.RequestFacts | None = None, vocab: int = V) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=vocab, stop_token_id=EOS, facts=facts)
    assert request is not None
    return request


def resident_and_host(payload: list[dict[str, Any]], histories: Sequence[Sequence[int]], *,
                      facts: sdk.RequestFacts | None = None, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One request on the resident path (a ``SlotBatch`` given the histories) and its twin on the host
    path, one step per history (random logits, the same for both): each step's two rows. Asserts the
    request is resident there."""
    resident, host = realize(payload, facts), realize(payload, facts)
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(1, resident), "the request is not resident"
    batch.flush()
    batch.set_rows(np.array([1]))
    out = []
    generator = torch.Generator().manual_seed(seed)
    for history in histories:
        logits = torch.randn(1, V, generator=generator)
        a, b = logits.clone(), logits.clone()
        batch.apply(a, EngineStep(histories=[history]))
        sdk.apply_rows(b, [0], [host], [history])
        out.append((a[0], b[0]))
    return out
