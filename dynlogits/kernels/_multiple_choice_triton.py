"""The Triton kernel of ``multiple_choice.py`` (imported only by ``multiple_choice.kernels()``:
importing this module imports Triton). Contract and what checks it: ``dynlogits.kernels.multiple_choice``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["keep_rows"]

#: ``multiple_choice.OUT_OF_PHASE``: a row whose base is at least this does not act
OUT_OF_PHASE: tl.constexpr = tl.constexpr(1 << 62)


@triton.jit(do_not_specialize=("logits_s0", "tokens_s0", "maxlen", "engine_slots", "prefix_s0", "depth_s0",
            "at_least_s0", "ids_s0", "entries", "width", "vocab"), do_not_specialize_on_alignment=("logits_ptr",
            "tokens_ptr", "base_ptr", "pos_ptr", "slot_ptr", "member_ptr", "prefix_ptr", "depth_ptr", "at_least_ptr",
            "ids_ptr", "input_ptr", "local_ptr", "saved_ptr", "at_ptr"))
def keep_rows(logits_ptr, logits_s0, tokens_ptr, tokens_s0, tokens_s1, maxlen, engine_slots, base_ptr, pos_ptr,
              slot_ptr, member_ptr, prefix_ptr, prefix_s0, depth_ptr, depth_s0, at_least_ptr, at_least_s0, ids_ptr,
              ids_s0, input_ptr, local_ptr, saved_ptr, at_ptr, entries, width, vocab, BLOCK_E: tl.constexpr,
              BLOCK_W: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK: tl.constexpr, HAS_DRAFTS: tl.constexpr):
    """Program ``(r, k)`` keeps columns ``[k * CHUNK, (k + 1) * CHUNK)`` of row ``r`` (its chunk; see
    the module doc), in three phases:

    1. per block of ``BLOCK_E`` entries, those whose id lies in the chunk (the entries it owns)
       decided: each one's prefix compared with the row's first tokens (``BLOCK_W`` columns at a
       time; with ``HAS_DRAFTS`` each position at most the row's own, those fed at the ``local_pos``
       rows before it read from ``input_ptr``), its depth with the row's history; an owned entry's logit (at its id) read and saved
       in the scratch where it matches (``saved_ptr``, row ``r``'s ``entries`` cells) with its id
       (``at_ptr``; ``-1`` for an owned entry not matched);
    2. the chunk filled with ``-inf`` (``BLOCK_V`` columns at a time);
    3. every owned matched entry's saved value stored back at its id.

    Race-free: each logit belongs to one chunk of one row, and each scratch cell ``(r, e)`` to the
    one program whose chunk holds entry ``e``'s id (an id outside ``[0, V)``: to none), so no two
    programs touch the same memory. Within the program, the barrier after phase 1 orders every
    thread's read of the chunk (and its scratch writes) before any thread's ``-inf`` store of phase
    2 (a read after a fill would see ``-inf``); the barrier after phase 2 orders every ``-inf``
    store before any thread's phase 3 store (a fill landing after a write back would erase it) and
    makes the scratch's writes visible to the threads that read it back (``bar.sync`` orders and
    publishes the block's global memory accesses). Two matched entries naming the same id store
    the same value, read in phase 1 before anything was written, so their order in phase 3 cannot
    matter. A row that does not act loops zero times in every phase and writes nothing; the
    barriers are reached by every thread of every program (no branch around them)."""
    r = tl.program_id(0).to(tl.int64)
    lo = tl.program_id(1).to(tl.int64) * CHUNK
    hi = tl.minimum(lo + CHUNK, vocab)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    eng = tl.minimum(slot, engine_slots - 1)
    start = tl.load(base_ptr + r).to(tl.int64)
    acting = (tl.load(member_ptr + r) != 0) & (start < OUT_OF_PHASE)
    p = tl.load(pos_ptr + r).to(tl.int64)
    n = tl.maximum(p - start + 1, 0)  # tokens of its history before the row
    if HAS_DRAFTS:
        local = tl.load(local_ptr + r).to(tl.int64)
    start = tl.where(acting, start, 0)  # (an out-of-phase base's columns are never formed)
    todo = tl.where(acting, entries, 0)
    filled = tl.where(acting, hi, lo)
    row = logits_ptr + r * logits_s0
    # phase 1: decide the owned entries, save the matched ones' logits
    for e0 in range(0, todo, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E).to(tl.int64)
        kept = tl.load(ids_ptr + slot * ids_s0 + e, mask=e < entries, other=-1).to(tl.int64)
        own = (kept >= lo) & (kept < hi)
        depth = tl.load(depth_ptr + slot * depth_s0 + e, mask=own, other=0)
        at_least = tl.load(at_least_ptr + slot * at_least_s0 + e, mask=own, other=0) != 0
        hit = own & ((depth == n) | (at_least & (depth <= n)))
        mismatch = tl.zeros([BLOCK_E], tl.int32)
        for w0 in range(0, width, BLOCK_W):
            c = w0 + tl.arange(0, BLOCK_W).to(tl.int64)
            inside = c < width
            q = start + c
            if HAS_DRAFTS:
                q = tl.minimum(q, p)  # as ``TokenWindow.head``: at most the row's own position
            column = tl.minimum(tl.maximum(q, 0), maxlen - 1)
            token = tl.load(tokens_ptr + eng * tokens_s0 + column * tokens_s1, mask=inside, other=0).to(tl.int64)
            if HAS_DRAFTS:
                back = p - q  # how many positions before the row's own
                fed = inside & (back <= local)  # the last committed token or a draft, fed back rows before
                drafted = tl.load(input_ptr + tl.maximum(r - back, 0), mask=fed, other=0).to(tl.int64)
                token = tl.where(fed, drafted, token)
            cells = tl.load(prefix_ptr + slot * prefix_s0 + e[:, None] * width + c[None, :],
                            mask=hit[:, None] & inside[None, :], other=-1).to(tl.int64)
            differs = (cells >= 0) & (cells != token[None, :])  # an unused cell (-1) matches anything
            mismatch = tl.maximum(mismatch, tl.max(differs.to(tl.int32), axis=1))
        hit = hit & (mismatch == 0)
        value = tl.load(row + tl.where(hit, kept, 0), mask=hit)
        tl.store(saved_ptr + r * entries + e, value, mask=hit)
        tl.store(at_ptr + r * entries + e, tl.where(hit, kept, -1).to(tl.int32), mask=own)
    tl.debug_barrier()  # every read of the chunk before any -inf (phase 2)
    # phase 2: the chunk filled
    for v0 in range(lo, filled, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        tl.store(row + v, tl.full([BLOCK_V], float("-inf"), logits_ptr.dtype.element_ty), mask=v < hi)
    tl.debug_barrier()  # every -inf and the scratch before any write back (phase 3)
    # phase 3: the matched owned entries' values back at their ids
    for e0 in range(0, todo, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E).to(tl.int64)
        kept = tl.load(ids_ptr + slot * ids_s0 + e, mask=e < entries, other=-1).to(tl.int64)
        own = (kept >= lo) & (kept < hi)
        back = tl.load(at_ptr + r * entries + e, mask=own, other=-1) >= 0
        value = tl.load(saved_ptr + r * entries + e, mask=back)
        tl.store(row + tl.where(back, kept, 0), value, mask=back)
