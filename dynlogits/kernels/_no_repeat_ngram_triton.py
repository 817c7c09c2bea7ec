"""The Triton kernel of ``no_repeat_ngram.py`` (imported only by ``no_repeat_ngram.kernels()``:
importing this module imports Triton). Contract and what checks it: ``dynlogits.kernels.no_repeat_ngram``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ban_rows", "read"]


@triton.jit
def read(tokens_ptr, tokens_s0, tokens_s1, maxlen, eng, q, p, r, ids_ptr, local, start, HAS_DRAFTS: tl.constexpr):
    """The tokens at positions ``q`` (int64) of row ``r`` and whether each counts (inside the
    history, not negative): drafts fed before the row from ``input_ids``, the rest from the matrix."""
    column = tl.minimum(tl.maximum(q, 0), maxlen - 1)
    token = tl.load(tokens_ptr + eng * tokens_s0 + column * tokens_s1).to(tl.int64)
    if HAS_DRAFTS:
        back = p - q
        fed = back <= local
        source = tl.maximum(r - back, 0)
        token = tl.where(fed, tl.load(ids_ptr + source, mask=fed, other=0).to(tl.int64), token)
    return token, (q >= start) & (token >= 0)


@triton.jit(do_not_specialize=("logits_s0", "tokens_s0", "maxlen", "params_s0", "width", "vocab"),
            do_not_specialize_on_alignment=("logits_ptr", "tokens_ptr", "pos_ptr", "slot_ptr", "params_ptr", "ids_ptr",
            "local_ptr", "floor_ptr"))
def ban_rows(logits_ptr, logits_s0, logits_s1, tokens_ptr, tokens_s0, tokens_s1, maxlen, pos_ptr, slot_ptr, params_ptr,
             params_s0, ids_ptr, local_ptr, floor_ptr, width, vocab, SIZE: tl.constexpr, BLOCK: tl.constexpr,
             HAS_DRAFTS: tl.constexpr, HAS_FLOOR: tl.constexpr):
    """One program per (row, block of ``BLOCK`` followers): their bans stored as ``-inf`` (see the
    module doc)."""
    r = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + r).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    start = tl.load(params_ptr + slot * params_s0)
    n = tl.load(params_ptr + slot * params_s0 + 1)
    first = tl.load(params_ptr + slot * params_s0 + 2)
    eng = tl.load(params_ptr + slot * params_s0 + 3)
    if HAS_DRAFTS:
        local = tl.load(local_ptr + r).to(tl.int64)
    else:
        local = -1
    if HAS_FLOOR:  # a scoped entry's stretch: nothing before the row's floor counts
        start = tl.maximum(start, tl.load(floor_ptr + r))
    start = tl.where(p >= first, start, p + 1)  # a prefill chunk's row: no position counts
    followers = width - SIZE + 1
    j = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    zeros = tl.zeros([BLOCK], tl.int64)
    f = p - (width - SIZE) + j
    token, counts = read(tokens_ptr, tokens_s0, tokens_s1, maxlen, eng, f, p, r, ids_ptr, local, start, HAS_DRAFTS)
    hit = (j < followers) & counts & (token < vocab)
    for k in tl.static_range(1, SIZE):
        tail, tail_counts = read(tokens_ptr, tokens_s0, tokens_s1, maxlen, eng, zeros + (p - k + 1), p, r, ids_ptr,
                                 local, start, HAS_DRAFTS)
        before, before_counts = read(tokens_ptr, tokens_s0, tokens_s1, maxlen, eng, f - k, p, r, ids_ptr, local,
                                     start, HAS_DRAFTS)
        same = tail_counts & before_counts & (tail == before)
        hit = hit & (same | (zeros + n <= k))  # compared only within the row's own size - 1
    target = logits_ptr + r * logits_s0 + tl.where(hit, token, 0) * logits_s1
    tl.store(target, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty), mask=hit)
