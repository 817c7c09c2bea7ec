"""The Triton kernel of ``dead_rows.py`` (imported only by ``dead_rows.kernels()``: importing this
module imports Triton). Contract and what checks it: ``dynlogits.kernels.dead_rows``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["dead_rows"]


@triton.jit(do_not_specialize=("logits_s0", "witness_s0", "width"), do_not_specialize_on_alignment=("logits_ptr",
            "witness_ptr", "rows_ptr", "slots_ptr", "positions_ptr", "stop_ptr", "can_stop_ptr", "where_ptr",
            "real_ptr", "flags_ptr"))
def dead_rows(logits_ptr, logits_s0, witness_ptr, witness_s0, witness_s1, width, rows_ptr, slots_ptr, positions_ptr,
              stop_ptr, can_stop_ptr, where_ptr, real_ptr, flags_ptr, LISTED: tl.constexpr,
              HAS_POSITIONS: tl.constexpr, HAS_CAN_STOP: tl.constexpr, HAS_WHERE: tl.constexpr,
              HAS_REAL: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``i``: row ``i``'s witness read (``BLOCK`` ids at a time), then, where every id is
    ``-inf``, its stop token written ``0.0`` and its slot's flag max-reduced with its position (see
    ``dead_rows``' module doc). ``LISTED``: witness and ``stop_ptr`` hold flat indices; else column
    ids of row ``i`` and each slot's stop token."""
    i = tl.program_id(0).to(tl.int64)
    if LISTED:
        base = logits_ptr
        row = tl.load(rows_ptr + i).to(tl.int64)
    else:
        base = logits_ptr + i * logits_s0
        row = i
    alive = tl.zeros([BLOCK], tl.int32)
    for start in range(0, width, BLOCK):
        j = start + tl.arange(0, BLOCK).to(tl.int64)
        inside = j < width
        index = tl.load(witness_ptr + i * witness_s0 + j * witness_s1, mask=inside, other=0)
        value = tl.load(base + index, mask=inside, other=float("-inf")).to(tl.float32)
        alive += (value != float("-inf")).to(tl.int32)  # NaN is not -inf: alive, as ``isneginf``
    dead = tl.sum(alive, axis=0) == 0
    if HAS_WHERE:
        dead = dead & (tl.load(where_ptr + i) != 0)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    if LISTED:
        at = tl.load(stop_ptr + i).to(tl.int64)
        stopping = dead
        if HAS_CAN_STOP:
            stopping = stopping & (tl.load(can_stop_ptr + i) != 0)
    else:
        stop = tl.load(stop_ptr + slot).to(tl.int64)
        at = tl.maximum(stop, 0)
        stopping = dead & (stop >= 0)
    tl.store(base + at, tl.zeros([], tl.float32).to(logits_ptr.dtype.element_ty), mask=stopping)
    flagged = dead
    if HAS_REAL:
        flagged = flagged & (tl.load(real_ptr + row) != 0)
    if HAS_POSITIONS:
        position = tl.load(positions_ptr + i).to(tl.int64)
    else:
        position = tl.zeros([], tl.int64)
    tl.atomic_max(flags_ptr + slot, tl.where(flagged, position, -1))
