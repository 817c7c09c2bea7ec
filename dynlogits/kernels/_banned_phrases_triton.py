"""The Triton kernel of ``banned_phrases.py`` (imported only by ``banned_phrases.kernels()``:
importing this module imports Triton). Contract and what checks it: ``dynlogits.kernels.banned_phrases``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ban_rows"]


@triton.jit(do_not_specialize=("logits_s0", "tokens_s0", "maxlen", "engine_slots", "prefix_s0", "bans_s0", "need_s0",
            "entries", "width", "vocab"), do_not_specialize_on_alignment=("logits_ptr", "tokens_ptr", "prompt_ptr",
            "pos_ptr", "slot_ptr", "member_ptr", "prefix_ptr", "bans_ptr", "need_ptr", "ids_ptr", "local_ptr",
            "floor_ptr"))
def ban_rows(logits_ptr, logits_s0, logits_s1, tokens_ptr, tokens_s0, tokens_s1, maxlen, engine_slots, prompt_ptr,
             pos_ptr, slot_ptr, member_ptr, prefix_ptr, prefix_s0, bans_ptr, bans_s0, need_ptr, need_s0, ids_ptr,
             local_ptr, floor_ptr, entries, width, vocab, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr,
             HAS_DRAFTS: tl.constexpr, HAS_FLOOR: tl.constexpr):
    """One program per (row, block of ``BLOCK_E`` entries): each entry's prefix compared with the
    row's last tokens ``BLOCK_W`` columns at a time, its ban stored as ``-inf`` where it matches
    (see the module doc)."""
    r = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    member = tl.load(member_ptr + r) != 0
    p = tl.load(pos_ptr + r).to(tl.int64)
    eng = tl.minimum(slot, engine_slots - 1)
    length = p - tl.load(prompt_ptr + eng).to(tl.int64) + 1  # the output's length (drafts fed included)
    if HAS_FLOOR:  # a scoped entry's stretch: a prefix lies from the row's floor on
        length = tl.minimum(length, p - tl.load(floor_ptr + r).to(tl.int64) + 1)
    length = tl.where(member, length, -1)  # a row outside the group: no entry (``need >= 0``) fits
    if HAS_DRAFTS:
        local = tl.load(local_ptr + r).to(tl.int64)
    else:
        local = -1
    e = tl.program_id(1).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    live = e < entries
    need = tl.load(need_ptr + slot * need_s0 + e, mask=live, other=0)
    hit = live & (need <= length)
    # only the columns an entry that can hit compares: fewer than min(width, length)
    reach = tl.maximum(tl.minimum(length, width), 0)
    mismatch = tl.zeros([BLOCK_E], tl.int32)
    for w0 in range(0, reach, BLOCK_W):
        back = w0 + tl.arange(0, BLOCK_W).to(tl.int64)  # how many positions before the row's own
        inside = back < reach
        column = tl.minimum(tl.maximum(p - back, 0), maxlen - 1)
        token = tl.load(tokens_ptr + eng * tokens_s0 + column * tokens_s1, mask=inside, other=0).to(tl.int64)
        if HAS_DRAFTS:
            fed = inside & (back <= local)  # the last committed token or a draft, fed back rows before
            drafted = tl.load(ids_ptr + tl.maximum(r - back, 0), mask=fed, other=0).to(tl.int64)
            token = tl.where(fed, drafted, token)
        cells = tl.load(prefix_ptr + slot * prefix_s0 + e[:, None] * width + (width - 1 - back)[None, :],
                        mask=live[:, None] & inside[None, :], other=0).to(tl.int64)
        used = inside[None, :] & (back[None, :] < need[:, None])
        mismatch = tl.maximum(mismatch, tl.max((used & (cells != token[None, :])).to(tl.int32), axis=1))
    ban = tl.load(bans_ptr + slot * bans_s0 + e, mask=live, other=0).to(tl.int64)
    hit = hit & (mismatch == 0) & (ban >= 0) & (ban < vocab)
    target = logits_ptr + r * logits_s0 + tl.where(hit, ban, 0) * logits_s1
    tl.store(target, tl.full([BLOCK_E], float("-inf"), logits_ptr.dtype.element_ty), mask=hit)
