"""The Triton kernel of ``thinking_force.py`` (imported only by ``thinking_force.kernels()``:
importing this module imports Triton). Contract and what checks it: ``dynlogits.kernels.thinking_force``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["settle_rows"]


@triton.jit(do_not_specialize=("logits_s0", "flags_s0", "vocab", "sentinel", "seq_s0", "len_s0"),
            do_not_specialize_on_alignment=("logits_ptr", "decisions_ptr", "member_ptr", "slots_ptr", "stops_ptr",
            "positions_ptr", "flags_ptr", "dead_ptr", "real_ptr", "seq_ptr", "len_ptr"))
def settle_rows(logits_ptr, logits_s0, decisions_ptr, member_ptr, slots_ptr, stops_ptr, positions_ptr, flags_ptr,
                flags_s0, dead_ptr, real_ptr, vocab, sentinel, seq_ptr, seq_s0, len_ptr, len_s0,
                HAS_POSITIONS: tl.constexpr, HAS_REAL: tl.constexpr, HAS_SEQUENCE: tl.constexpr, SCOPED: tl.constexpr,
                BLOCK: tl.constexpr):
    """Program ``(r, b)``: row ``r``'s columns ``b * BLOCK ..``; block 0 also reads the forced logit,
    writes the forced and stop columns and the row's flags (see ``thinking_force``' module doc)."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    decision = tl.load(decisions_ptr + r).to(tl.int64)
    slot = tl.load(slots_ptr + r).to(tl.int64)
    if HAS_SEQUENCE:  # ``decision`` is the row's count: its token in the slot's sequence, its position
        count = decision
        span = tl.load(len_ptr + slot * len_s0).to(tl.int64)
        decision = tl.load(seq_ptr + slot * seq_s0 + tl.minimum(tl.maximum(count, 0), span)).to(tl.int64)
        if SCOPED:
            decision = tl.where(count >= 0, decision, -1)
        counted = tl.minimum(count, span)
    fire = (tl.load(member_ptr + r) != 0) & (decision >= 0)
    column = tl.maximum(decision, 0)
    stop = tl.load(stops_ptr + slot).to(tl.int64)
    row = logits_ptr + r * logits_s0
    cols = b * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    zero = tl.zeros([BLOCK], tl.int64)  # the row's scalars as vectors (a scalar & a vector: not in the interpreter)
    stops = zero + stop
    fill = ((zero + fire.to(tl.int64)) != 0) & (cols < vocab) & (cols != column) & ((stops < 0) | (cols != stops))
    tl.store(row + cols, tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty), mask=fill)
    if b == 0:
        kept = tl.load(row + column).to(tl.float32)
        dead = fire & (kept == float("-inf"))
        forced = tl.where(dead, float("-inf"), 0.0)
        tl.store(row + column, forced.to(logits_ptr.dtype.element_ty), mask=fire)
        at_stop = tl.where(dead, 0.0, tl.where(stop == column, forced, float("-inf")))
        tl.store(row + stop, at_stop.to(logits_ptr.dtype.element_ty), mask=fire & (stop >= 0))
        if HAS_REAL:  # a dead row after a draft only stops (its draft may be rejected)
            flagged = dead & (tl.load(real_ptr + r) != 0)
        else:
            flagged = dead
        tl.store(flags_ptr + r, tl.where(flagged, slot, sentinel))
        if HAS_SEQUENCE:
            position = counted
        elif HAS_POSITIONS:
            position = tl.load(positions_ptr + r).to(tl.int64)
        else:
            position = tl.zeros([], tl.int64)
        tl.store(flags_ptr + flags_s0 + r, position)
        tl.store(dead_ptr + r, dead)
