"""The Triton kernels of ``watermark.py`` (imported only by ``watermark.kernels()``: importing this
module imports Triton). Contracts and what checks them: ``dynlogits.kernels.watermark``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``.

The one exception: the draw kernels (``draw_blocks``, ``draw_reduce``) stream whole logits rows, so
their ``logits_ptr``, ``logits_stride`` and ``vocab`` stay keyed (a 16-divisible row stride and an
aligned base let Triton emit vector loads: 2 ``ld.global.v4`` against none in ``draw_blocks``' sm_90
PTX). These are deployment constants (``SlotBatch`` takes contiguous ``[rows, vocab]`` logits; with
a vocabulary divisible by 4 every row view stays 16-byte aligned), and ``warm(device, vocab)``
compiles the deployment's variant at load (``dynlogits.sdk.resident.warm.compile_for_vocab``)."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

__all__ = ["INTERPRETED", "absorb_rows", "context_word", "draw_blocks", "draw_reduce", "log", "philox", "window_decide",
           "window_tokens", "window_word"]

#: whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, read as Triton reads it)
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")

if INTERPRETED:  # libdevice's functions are stubs in the interpreter: numpy's log stands in (not libdevice's bits)

    @triton.jit
    def log(x):
        """Natural log (interpreter: numpy's float32 ``log``)."""
        return tl.log(x)

else:

    @triton.jit
    def log(x):
        """Natural log: libdevice's ``__nv_logf``, the CUDA math library's ``logf`` (torch's CUDA ``log``)."""
        return libdevice.log(x)


@triton.jit
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 words (products wrap modulo 2**32, ``umulhi`` the high half)."""
    m0 = tl.full(c0.shape, 0xD2511F53, tl.uint32)
    m1 = tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3

@triton.jit(do_not_specialize=("temp_stride", "params_stride", "states_stride0", "nblocks"),  # logits: keyed (module doc)
            do_not_specialize_on_alignment=("rows_ptr", "slots_ptr", "temp_ptr", "params_ptr", "states_ptr", "best_ptr",
            "index_ptr", "kept_ptr", "u_ptr", "score_ptr"))
def draw_blocks(logits_ptr, logits_stride, rows_ptr, slots_ptr, temp_ptr, temp_stride, params_ptr, params_stride,
                states_ptr, states_stride0, states_stride1, best_ptr, index_ptr, kept_ptr, vocab, nblocks,
                u_ptr, score_ptr, BLOCK: tl.constexpr, SCORES: tl.constexpr):
    """Per (row, block): the block's best score (NaN first), its lowest index, the logit there;
    ``SCORES`` (tests) also writes every id's uniform and score (``[n, vocab]``)."""
    i = tl.program_id(0)
    b = tl.program_id(1)
    row = tl.load(rows_ptr + i).to(tl.int64)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    temp = tl.load(temp_ptr + slot * temp_stride).to(tl.float32)
    key_lo = tl.load(params_ptr + slot * params_stride).to(tl.uint32)
    key_hi = tl.load(params_ptr + slot * params_stride + 1).to(tl.uint32)
    s0 = tl.load(states_ptr + i * states_stride0).to(tl.uint32)
    s1 = tl.load(states_ptr + i * states_stride0 + states_stride1).to(tl.uint32)
    s2 = tl.load(states_ptr + i * states_stride0 + 2 * states_stride1).to(tl.uint32)
    s3 = tl.load(states_ptr + i * states_stride0 + 3 * states_stride1).to(tl.uint32)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    valid = offs < vocab
    ids = offs.to(tl.uint32)
    zero = tl.zeros([BLOCK], tl.uint32)
    k0 = zero + (key_lo ^ s3)
    k1 = zero + (key_hi ^ 0x574D544B)
    w0, w1, w2, w3 = philox(ids >> 2, zero + s0, zero + s1, zero + s2, k0, k1)
    which = ids & 3
    word = tl.where(which == 0, w0, tl.where(which == 1, w1, tl.where(which == 2, w2, w3)))
    mantissa = (word >> 8).to(tl.float64)
    u = ((mantissa + 1.0) / 16777217.0).to(tl.float32)  # float64 division: div.rn.f64
    u = tl.maximum(u, 1.1754943508222875e-38)
    noise = -log(-log(u))
    logit = tl.load(logits_ptr + row * logits_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    score = tl.math.div_rn(logit, zero.to(tl.float32) + temp) + noise
    if SCORES:
        tl.store(u_ptr + i * vocab + offs, u, mask=valid)
        tl.store(score_ptr + i * vocab + offs, score, mask=valid)
    score = tl.where(valid, score, float("-inf"))
    nan = score != score
    big = 2147483647
    first_nan = tl.min(tl.where(nan, offs, big), axis=0)
    best = tl.max(tl.where(nan, float("-inf"), score), axis=0)
    at = tl.min(tl.where(score == best, offs, big), axis=0)
    at = tl.where(first_nan < big, first_nan, at)
    best = tl.where(first_nan < big, float("nan"), best)
    kept = tl.sum(tl.where(offs == at, logit, 0.0), axis=0)  # the logit there (one lane; -inf + 0.0 stays -inf)
    tl.store(best_ptr + i * nblocks + b, best)
    tl.store(index_ptr + i * nblocks + b, at)
    tl.store(kept_ptr + i * nblocks + b, kept)

@triton.jit(do_not_specialize=("nblocks",), do_not_specialize_on_alignment=("rows_ptr", "fire_ptr", "best_ptr",  # logits: keyed
            "index_ptr", "kept_ptr", "tokens_ptr"))
def draw_reduce(logits_ptr, logits_stride, rows_ptr, fire_ptr, best_ptr, index_ptr, kept_ptr, tokens_ptr, vocab,
                nblocks, BLOCK: tl.constexpr, NB: tl.constexpr, HAS_FIRE: tl.constexpr,
                FORCE: tl.constexpr):
    i = tl.program_id(0)
    b = tl.program_id(1)
    blocks = tl.arange(0, NB)
    present = blocks < nblocks
    best = tl.load(best_ptr + i * nblocks + blocks, mask=present, other=float("-inf"))
    big = 2147483647
    nan = best != best
    first_nan = tl.min(tl.where(nan, blocks, big), axis=0)
    top = tl.max(tl.where(nan, float("-inf"), best), axis=0)
    winner = tl.min(tl.where(present & (best == top), blocks, big), axis=0)
    winner = tl.where(first_nan < big, first_nan, winner)
    token = tl.load(index_ptr + i * nblocks + winner).to(tl.int64)
    if b == 0:
        tl.store(tokens_ptr + i, token)
    if FORCE:
        if HAS_FIRE:
            fires = (tl.load(fire_ptr + i) != 0).to(tl.int32)
        else:
            fires = 1
        kept = tl.load(kept_ptr + i * nblocks + winner)
        value = tl.where(kept == float("-inf"), float("-inf"), 0.0)
        row = tl.load(rows_ptr + i).to(tl.int64)
        offs = b * BLOCK + tl.arange(0, BLOCK)
        out = tl.where(offs == token, value, float("-inf"))
        ptrs = logits_ptr + row * logits_stride + offs
        tl.store(ptrs, out.to(logits_ptr.dtype.element_ty), mask=(offs < vocab) & ((tl.zeros([BLOCK], tl.int32) + fires) != 0))

@triton.jit
def context_word(ctx_ptr, rr, ctx_stride, ctx_stride1, live, widths, zero, J: tl.constexpr, WORD: tl.constexpr,
                 WIDTH: tl.constexpr):
    """Context column ``J`` as the absorb's word ``WORD`` of its block: the id (32 bits) where the row's
    width covers it, else the padding ``2**32 - 1 - WORD``."""
    if J < WIDTH:
        token = tl.load(ctx_ptr + rr * ctx_stride + J * ctx_stride1, mask=live, other=0).to(tl.uint32)
        word = tl.where(widths > J, token, zero + (0xFFFFFFFF - WORD))
    else:
        word = zero + (0xFFFFFFFF - WORD)
    return word


@triton.jit(do_not_specialize=("keys_stride", "ctx_stride", "widths_stride", "n"),
            do_not_specialize_on_alignment=("keys_ptr", "ctx_ptr", "widths_ptr", "out_ptr"))
def absorb_rows(keys_ptr, keys_stride, keys_stride1, ctx_ptr, ctx_stride, ctx_stride1, widths_ptr, widths_stride, out_ptr, n, WIDTH: tl.constexpr,
                HAS_WIDTHS: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = r < n
    rr = r.to(tl.int64)
    k0 = tl.load(keys_ptr + rr * keys_stride, mask=live, other=0).to(tl.uint32)
    k1 = tl.load(keys_ptr + rr * keys_stride + keys_stride1, mask=live, other=0).to(tl.uint32)
    zero = tl.zeros([ROWS], tl.uint32)
    if HAS_WIDTHS:
        widths = tl.load(widths_ptr + rr * widths_stride, mask=live, other=0).to(tl.int64)
        s1 = widths.to(tl.uint32)
    else:
        widths = tl.zeros([ROWS], tl.int64) + WIDTH
        s1 = zero + WIDTH
    s0 = zero + 0x574D4358
    s2 = zero
    s3 = zero
    for offset in tl.static_range(0, WIDTH, 4):  # four named words: a Python list is a tuple to Triton's compiler
        w0 = context_word(ctx_ptr, rr, ctx_stride, ctx_stride1, live, widths, zero, offset, 0, WIDTH)
        w1 = context_word(ctx_ptr, rr, ctx_stride, ctx_stride1, live, widths, zero, offset + 1, 1, WIDTH)
        w2 = context_word(ctx_ptr, rr, ctx_stride, ctx_stride1, live, widths, zero, offset + 2, 2, WIDTH)
        w3 = context_word(ctx_ptr, rr, ctx_stride, ctx_stride1, live, widths, zero, offset + 3, 3, WIDTH)
        n0, n1, n2, n3 = philox(s0 ^ w0, s1 ^ w1, s2 ^ w2, s3 ^ w3, k0 ^ offset, k1)
        absorbs = widths > offset
        s0 = tl.where(absorbs, n0, s0)
        s1 = tl.where(absorbs, n1, s1)
        s2 = tl.where(absorbs, n2, s2)
        s3 = tl.where(absorbs, n3, s3)
    tl.store(out_ptr + rr * 4, s0.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 4 + 1, s1.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 4 + 2, s2.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 4 + 3, s3.to(tl.int64), mask=live)


@triton.jit
def window_tokens(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, at, rows, pos, local, input_ptr, live,
                  DRAFTS: tl.constexpr):
    """``TokenWindow._read`` at positions ``at`` (clamped to 0, and to the matrix's last column so no
    load leaves it): the committed token of ``slot``, or where ``DRAFTS`` and the column is at most
    ``local`` positions before the row's own (``pos``), the id fed at row ``rows - back``; int64."""
    col = tl.minimum(tl.maximum(at, 0), n_cols - 1)
    token = tl.load(tokens_ptr + slot * tokens_stride0 + col * tokens_stride1, mask=live, other=0).to(tl.int64)
    if DRAFTS:
        back = pos - tl.maximum(at, 0)
        fed = back <= local
        src = tl.maximum(rows - back, 0)
        token = tl.where(fed, tl.load(input_ptr + src, mask=live & fed, other=0).to(tl.int64), token)
    return token


@triton.jit
def window_word(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, rr, pos, local, input_ptr, live, prompt, width,
                zero, J: tl.constexpr, WORD: tl.constexpr, WIDE: tl.constexpr, EVERY: tl.constexpr, DRAFTS: tl.constexpr):
    """Context column ``J`` (of ``WIDE``, each row's own ``width`` left-aligned unless ``EVERY``: the
    column ``WIDE - width + J`` of the last ``WIDE``, clamped) as the absorb's word ``WORD``: the id read
    from the window (``-1`` before the output, 32 bits) where the width covers it, else the padding."""
    if J < WIDE:
        if EVERY:
            src = zero.to(tl.int64) + J
        else:
            src = tl.minimum(tl.maximum(WIDE - width + J, 0), WIDE - 1)
        at = pos - (WIDE - 1) + src
        token = window_tokens(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, at, rr, pos, local, input_ptr,
                              live, DRAFTS)
        token = tl.where(at >= prompt, token, -1).to(tl.uint32)
        word = tl.where(width > J, token, zero + (0xFFFFFFFF - WORD))
    else:
        word = zero + (0xFFFFFFFF - WORD)
    return word


@triton.jit(do_not_specialize=("tokens_stride0", "n_slots", "n_cols", "params_stride0", "n", "span", "max_history"),
            do_not_specialize_on_alignment=("tokens_ptr", "prompt_ptr", "pos_ptr", "input_ptr", "local_ptr", "slot_ptr",
            "member_ptr", "params_ptr", "out_ptr"))
def window_decide(tokens_ptr, tokens_stride0, tokens_stride1, n_slots, n_cols, prompt_ptr, pos_ptr, input_ptr,
                  local_ptr, slot_ptr, member_ptr, params_ptr, params_stride0, params_stride1, out_ptr, n, span,
                  max_history, WIDE: tl.constexpr, EVERY: tl.constexpr, DRAFTS: tl.constexpr, ROWS: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Per row: its last ``span`` tokens read from the window, a placeholder in its output, its
    context's repeat within ``max_history`` positions, the context absorbed (``absorb_rows``) and
    whether it draws: ``out[r] = (s0, s1, s2, s3, draws)`` int64."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = r < n
    rr = r.to(tl.int64)
    slot_raw = tl.load(slot_ptr + rr, mask=live, other=0).to(tl.int64)
    slot = tl.minimum(slot_raw, n_slots - 1)
    pos = tl.load(pos_ptr + rr, mask=live, other=0).to(tl.int64)
    prompt = tl.load(prompt_ptr + slot, mask=live, other=0).to(tl.int64)
    if DRAFTS:
        local = tl.load(local_ptr + rr, mask=live, other=0).to(tl.int64)
    else:
        local = pos
    prow = params_ptr + slot_raw * params_stride0
    k0 = tl.load(prow, mask=live, other=0).to(tl.uint32)
    k1 = tl.load(prow + params_stride1, mask=live, other=0).to(tl.uint32)
    if EVERY:
        width = tl.zeros([ROWS], tl.int64) + WIDE
    else:
        width = tl.load(prow + 2 * params_stride1, mask=live, other=0).to(tl.int64)
    samples = tl.load(prow + 3 * params_stride1, mask=live, other=0).to(tl.int64) > 0
    member = tl.load(member_ptr + rr, mask=live, other=0) != 0
    start = pos - (span - 1)  # the span's first position
    first = prompt + (width - 1)  # the first position a whole context ends at
    floor = pos - max_history
    ends = span - WIDE
    # a placeholder in the output, and a window of the output equal to the context (the repeat)
    placeholder = tl.zeros([ROWS], tl.int32)
    repeated = tl.zeros([ROWS], tl.int32)
    r2, pos2, local2, slot2, live2 = rr[:, None], pos[:, None], local[:, None], slot[:, None], live[:, None]
    for c in range(0, span, BLOCK):
        j = c + tl.arange(0, BLOCK)[None, :]
        inside = live2 & (j < span)
        at = start[:, None] + j
        tok = window_tokens(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot2, at, r2, pos2, local2,
                            input_ptr, inside, DRAFTS)
        hole = inside & (tok < 0) & (at >= prompt[:, None])
        placeholder = tl.maximum(placeholder, tl.max(hole.to(tl.int32), axis=1))
        end = at + (WIDE - 1)  # the window ``j .. j + WIDE - 1`` ends there
        same = inside & (j < ends) & (end >= first[:, None]) & (end >= floor[:, None])
        for b in tl.static_range(WIDE):
            mine = window_tokens(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot2, end - b, r2, pos2, local2,
                                 input_ptr, same, DRAFTS)
            last = window_tokens(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot2, pos2 - b, r2, pos2,
                                 local2, input_ptr, live2, DRAFTS)
            equal = mine == last
            if not EVERY:
                equal = equal | (width[:, None] <= b)
            same = same & equal
        repeated = tl.maximum(repeated, tl.max(same.to(tl.int32), axis=1))
    # the context (-1 before the output), each row's own width left-aligned, absorbed as absorb_rows
    zero = tl.zeros([ROWS], tl.uint32)
    s0 = zero + 0x574D4358
    s1 = width.to(tl.uint32)
    s2 = zero
    s3 = zero
    for offset in tl.static_range(0, WIDE, 4):  # four named words, as absorb_rows
        w0 = window_word(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, rr, pos, local, input_ptr, live, prompt,
                         width, zero, offset, 0, WIDE, EVERY, DRAFTS)
        w1 = window_word(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, rr, pos, local, input_ptr, live, prompt,
                         width, zero, offset + 1, 1, WIDE, EVERY, DRAFTS)
        w2 = window_word(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, rr, pos, local, input_ptr, live, prompt,
                         width, zero, offset + 2, 2, WIDE, EVERY, DRAFTS)
        w3 = window_word(tokens_ptr, tokens_stride0, tokens_stride1, n_cols, slot, rr, pos, local, input_ptr, live, prompt,
                         width, zero, offset + 3, 3, WIDE, EVERY, DRAFTS)
        n0, n1, n2, n3 = philox(s0 ^ w0, s1 ^ w1, s2 ^ w2, s3 ^ w3, k0 ^ offset, k1)
        absorbs = width > offset
        s0 = tl.where(absorbs, n0, s0)
        s1 = tl.where(absorbs, n1, s1)
        s2 = tl.where(absorbs, n2, s2)
        s3 = tl.where(absorbs, n3, s3)
    draws = member & samples & (placeholder == 0) & (repeated == 0)
    tl.store(out_ptr + rr * 5, s0.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 5 + 1, tl.where(width > 0, s1.to(tl.int64), width), mask=live)  # unabsorbed: the width
    tl.store(out_ptr + rr * 5 + 2, s2.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 5 + 3, s3.to(tl.int64), mask=live)
    tl.store(out_ptr + rr * 5 + 4, draws.to(tl.int64), mask=live)
