"""The Triton kernel of ``dry.py`` (imported only by ``dry.kernels()``: importing this module imports
Triton). Contracts and what checks them: ``dynlogits.kernels.dry``.

Specialization: the package rule (``dynlogits.kernels``): every runtime int in ``do_not_specialize``,
every pointer in ``do_not_specialize_on_alignment``."""

# ruff: noqa: ANN001, ANN202, N803
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["decide_rows"]


@triton.jit
def _read(tokens_ptr, tokens_stride, wslot, input_ptr, input_stride, row, pos, local, start, width, col, mask,
          DRAFTS: tl.constexpr):
    """The tokens at window columns ``col`` (int64) of ``row`` and whether each is inside its window
    (``TokenWindow._read``: a draft fed before the row from ``input_ids``; inside: at or past
    ``start`` and not a placeholder)."""
    at = pos - (width - 1) + col
    column = tl.maximum(at, 0)
    if DRAFTS:
        back = pos - column
        fed = back <= local
        tok = tl.load(tokens_ptr + wslot * tokens_stride + column, mask=mask & (back > local), other=-1).to(tl.int64)
        drafted = tl.load(input_ptr + tl.maximum(row - back, 0) * input_stride, mask=mask & fed, other=-1).to(tl.int64)
        tok = tl.where(fed, drafted, tok)
    else:
        tok = tl.load(tokens_ptr + wslot * tokens_stride + column, mask=mask, other=-1).to(tl.int64)
    return tok, mask & (at >= start) & (tok >= 0)


@triton.jit
def _is_breaker(singles_ptr, singles_stride, slot, n_singles, x, mask, LOG_S: tl.constexpr):
    """Whether each ``x`` (where ``mask``) is in the slot's sorted breakers: ``searchsorted`` (left),
    then an equality, as ``torch.searchsorted`` finds it."""
    lo = tl.zeros_like(x)
    hi = lo + n_singles
    base = singles_ptr + slot * singles_stride
    for _ in tl.static_range(LOG_S):
        active = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(base + mid, mask=mask & active, other=0)
        right = value < x
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (value >= x), mid, hi)
    found = tl.load(base + tl.minimum(lo, n_singles - 1), mask=mask, other=-1)
    return mask & (found == x)


@triton.jit
def _bf16(x):
    """float32 ``x`` rounded to bfloat16 to nearest, ties to even, in integer ops (the interpreter's
    own conversion truncates): ``cvt.rn.bf16.f32``'s result; NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.where(x != x, x.to(tl.bfloat16), rounded)


@triton.jit(do_not_specialize=("logits_stride", "tokens_stride", "n_token_rows", "prompt_stride", "pos_stride",
            "input_stride", "local_stride", "slot_stride", "member_stride", "floor_stride", "params_stride",
            "singles_stride", "n_singles", "amounts_stride", "n_amounts", "out_stride", "width", "cap", "largest"),
            do_not_specialize_on_alignment=("logits_ptr", "tokens_ptr", "prompt_ptr", "pos_ptr", "input_ptr",
            "local_ptr", "slot_ptr", "member_ptr", "floor_ptr", "params_ptr", "singles_ptr", "amounts_ptr", "ids_ptr",
            "lowered_ptr"))
def decide_rows(logits_ptr, logits_stride, tokens_ptr, tokens_stride, n_token_rows, prompt_ptr, prompt_stride, pos_ptr,
                pos_stride, input_ptr, input_stride, local_ptr, local_stride, slot_ptr, slot_stride, member_ptr,
                member_stride, floor_ptr, floor_stride, params_ptr, params_stride, singles_ptr, singles_stride, n_singles, amounts_ptr,
                amounts_stride, n_amounts, ids_ptr, lowered_ptr, out_stride, width, cap, largest,
                BLOCK: tl.constexpr, TAIL: tl.constexpr, LOG_S: tl.constexpr, DRAFTS: tl.constexpr,
                F64: tl.constexpr, BF16: tl.constexpr, HAS_FLOOR: tl.constexpr):
    """Per (row, block of ``BLOCK`` positions): each position's id (the token after it, 0 outside)
    and the logit there lowered by its penalty (``dry_device.device_penalties`` then the values
    ``lower_rows`` reduces); with ``HAS_FLOOR`` a row's window starts at its floor at the earliest."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    slot = tl.load(slot_ptr + row * slot_stride).to(tl.int64)
    wslot = tl.minimum(slot, n_token_rows - 1)
    pos = tl.load(pos_ptr + row * pos_stride).to(tl.int64)
    allowed = tl.load(params_ptr + slot * params_stride).to(tl.int64)
    lookback = tl.load(params_ptr + slot * params_stride + 1).to(tl.int64)
    with_prompt = tl.load(params_ptr + slot * params_stride + 2)
    own_cap = tl.load(params_ptr + slot * params_stride + 3).to(tl.int64)
    prompt = tl.load(prompt_ptr + wslot * prompt_stride).to(tl.int64)
    start = tl.maximum(pos + 1 - lookback, tl.where(with_prompt > 0, 0, prompt))
    if HAS_FLOOR:
        start = tl.maximum(start, tl.load(floor_ptr + row * floor_stride).to(tl.int64))
    flag = tl.load(member_ptr + row * member_stride).to(tl.int64)
    local = pos * 0 - 1
    if DRAFTS:
        local = tl.load(local_ptr + row * local_stride).to(tl.int64)
    # the nearest breaker within the last ``cap`` columns (one before them limits nothing measured)
    k = tl.arange(0, TAIL)
    tail_col = (width - cap + k).to(tl.int64)
    tail_tok, tail_in = _read(tokens_ptr, tokens_stride, wslot, input_ptr, input_stride, row, pos, local, start, width,
                              tail_col, k < cap, DRAFTS)
    tail_break = _is_breaker(singles_ptr, singles_stride, slot, n_singles, tail_tok, tail_in, LOG_S)
    limit = tl.minimum(width - tl.max(tl.where(tail_break, tail_col + 1, 0), 0), own_cap)
    # each position's repeat: its tokens back against the window's last ones, up to the limit
    p = (block * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    valid = p < width - 1
    member = (p * 0 + flag) != 0  # a vector (the interpreter keeps a loaded scalar's compare as uint8)
    reach = tl.minimum(limit, cap)
    alive = valid & member & ((p * 0 + reach) >= allowed)  # a vector compare (the interpreter: a scalar one is uint8)
    length = tl.zeros([BLOCK], tl.int64)
    back = 0
    while (back < reach) & (tl.max(alive.to(tl.int32), 0) > 0):
        here, here_in = _read(tokens_ptr, tokens_stride, wslot, input_ptr, input_stride, row, pos, local, start, width,
                              p - back, alive & (p - back >= 0), DRAFTS)
        end, end_in = _read(tokens_ptr, tokens_stride, wslot, input_ptr, input_stride, row, pos, local, start, width,
                            p * 0 + (width - 1 - back), alive, DRAFTS)
        alive = alive & here_in & end_in & (here == end)
        length += alive.to(tl.int64)
        back += 1
    after, after_in = _read(tokens_ptr, tokens_stride, wslot, input_ptr, input_stride, row, pos, local, start, width,
                            p + 1, valid, DRAFTS)
    maybe = valid & member & (length >= allowed) & after_in
    penalizes = maybe & ~_is_breaker(singles_ptr, singles_stride, slot, n_singles, after, maybe, LOG_S)
    exponent = tl.minimum(tl.maximum(length - allowed, 0), n_amounts - 1)
    penalty = tl.load(amounts_ptr + slot * amounts_stride + exponent, mask=penalizes, other=0.0).to(tl.float64)
    ids = tl.where(after_in, after, 0)
    kept = tl.load(logits_ptr + row * logits_stride + ids, mask=valid, other=0.0)
    if F64:
        largest64 = tl.full([BLOCK], 9218868437227405311, tl.int64).to(tl.float64, bitcast=True)
        lowered = kept - tl.minimum(penalty, largest64)
        lowest = tl.full([BLOCK], -4503599627370497, tl.int64).to(tl.float64, bitcast=True)
    elif BF16:  # at most the dtype's largest, rounded as torch rounds float64 to it (through float32)
        amount = _bf16(tl.minimum(penalty, largest).to(tl.float32))
        lowered = _bf16(kept.to(tl.float32) - amount.to(tl.float32))
        lowest = (tl.zeros([BLOCK], tl.float32) - largest).to(tl.bfloat16)  # exact
    else:
        amount = tl.minimum(penalty, largest).to(tl.float32).to(kept.dtype)
        lowered = (kept.to(tl.float32) - amount.to(tl.float32)).to(kept.dtype)
        lowest = (tl.zeros([BLOCK], tl.float32) - largest).to(kept.dtype)
    # past the dtype's range a finite logit stops at the lowest; -inf, +inf and NaN stay
    lowered = tl.where((lowered == float("-inf")) & (kept != float("-inf")), lowest, lowered)
    tl.store(ids_ptr + row * out_stride + p, ids, mask=valid)
    tl.store(lowered_ptr + row * out_stride + p, lowered, mask=valid)
