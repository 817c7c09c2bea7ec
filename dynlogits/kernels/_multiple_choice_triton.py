"""The Triton kernel of ``multiple_choice.py`` (imported only by ``multiple_choice.kernels()``:
importing this module imports Triton). Contract and what checks it: ``dynlogits.kernels.multiple_choice``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["keep_rows"]

#: ``multiple_choice.OUT_OF_PHASE``: a row whose base is at least this does not act
OUT_OF_PHASE: tl.constexpr = tl.constexpr(1 << 62)


@triton.jit
def keep_rows(logits_ptr, logits_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, engine_slots, base_ptr, pos_ptr,
              slot_ptr, member_ptr, prefix_ptr, prefix_s0, depth_ptr, depth_s0, at_least_ptr, at_least_s0, ids_ptr,
              ids_s0, saved_ptr, at_ptr, entries, width, vocab, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr,
              BLOCK_V: tl.constexpr):
    """Program ``r`` keeps row ``r`` (see the module doc), in three phases:

    1. per block of ``BLOCK_E`` entries, each entry's prefix compared with the row's first tokens
       (``BLOCK_W`` columns at a time) and its depth with the row's history; a matched entry's
       logit (at its id) read and saved in the scratch (``saved_ptr``, row ``r``'s ``entries``
       cells) with its id (``at_ptr``; ``-1`` for an entry not matched);
    2. the row filled with ``-inf`` (``BLOCK_V`` columns at a time);
    3. every matched entry's saved value stored back at its id.

    Race-free: a program reads and writes only row ``r`` of ``logits`` and of the scratch, so
    programs never meet. Within the program, the barrier after phase 1 orders every thread's read
    of the row (and its scratch writes) before any thread's ``-inf`` store of phase 2 (a read after
    a fill would see ``-inf``); the barrier after phase 2 orders every ``-inf`` store before any
    thread's phase 3 store (a fill landing after a write back would erase it) and makes the
    scratch's writes visible to the threads that read it back (``bar.sync`` orders and publishes
    the block's global memory accesses). Two matched entries naming the same id store the same
    value, read in phase 1 before anything was written, so their order in phase 3 cannot matter.
    A row that does not act loops zero times in every phase and writes nothing; the barriers are
    reached by every thread of every program (no branch around them)."""
    r = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    eng = tl.minimum(slot, engine_slots - 1)
    start = tl.load(base_ptr + r).to(tl.int64)
    acting = (tl.load(member_ptr + r) != 0) & (start < OUT_OF_PHASE)
    n = tl.maximum(tl.load(pos_ptr + r).to(tl.int64) - start + 1, 0)  # tokens of its history before the row
    start = tl.where(acting, start, 0)  # (an out-of-phase base's columns are never formed)
    todo = tl.where(acting, entries, 0)
    fill = tl.where(acting, vocab, 0)
    row = logits_ptr + r * logits_s0
    # phase 1: decide every entry, save the matched ones' logits
    for e0 in range(0, todo, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E).to(tl.int64)
        live = e < entries
        depth = tl.load(depth_ptr + slot * depth_s0 + e, mask=live, other=0)
        at_least = tl.load(at_least_ptr + slot * at_least_s0 + e, mask=live, other=0) != 0
        hit = live & ((depth == n) | (at_least & (depth <= n)))
        mismatch = tl.zeros([BLOCK_E], tl.int32)
        for w0 in range(0, width, BLOCK_W):
            c = w0 + tl.arange(0, BLOCK_W).to(tl.int64)
            inside = c < width
            column = tl.minimum(tl.maximum(start + c, 0), maxlen - 1)
            token = tl.load(tokens_ptr + eng * tokens_s0 + column * tokens_s1, mask=inside, other=0).to(tl.int64)
            cells = tl.load(prefix_ptr + slot * prefix_s0 + e[:, None] * width + c[None, :],
                            mask=live[:, None] & inside[None, :], other=-1).to(tl.int64)
            differs = (cells >= 0) & (cells != token[None, :])  # an unused cell (-1) matches anything
            mismatch = tl.maximum(mismatch, tl.max(differs.to(tl.int32), axis=1))
        kept = tl.load(ids_ptr + slot * ids_s0 + e, mask=live, other=0).to(tl.int64)
        hit = hit & (mismatch == 0) & (kept >= 0) & (kept < vocab)
        value = tl.load(row + tl.where(hit, kept, 0), mask=hit)
        tl.store(saved_ptr + r * entries + e, value, mask=hit)
        tl.store(at_ptr + r * entries + e, tl.where(hit, kept, -1).to(tl.int32), mask=live)
    tl.debug_barrier()  # every read of the row before any -inf (phase 2)
    # phase 2: the row filled
    for v0 in range(0, fill, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        tl.store(row + v, tl.full([BLOCK_V], float("-inf"), logits_ptr.dtype.element_ty), mask=v < vocab)
    tl.debug_barrier()  # every -inf and the scratch before any write back (phase 3)
    # phase 3: the matched entries' values back at their ids
    for e0 in range(0, todo, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E).to(tl.int64)
        live = e < entries
        kept = tl.load(at_ptr + r * entries + e, mask=live, other=-1).to(tl.int64)
        back = kept >= 0
        value = tl.load(saved_ptr + r * entries + e, mask=back)
        tl.store(row + tl.where(back, kept, 0), value, mask=back)
