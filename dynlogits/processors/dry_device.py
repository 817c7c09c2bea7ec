"""``dry`` decided on the device, from the step's ``TokenWindow`` (Model Runner V2: the rows'
histories live on the device): no history read back, no sync.

Per row of the step (gathered: every row, members masked), with the group's window ``W`` (its
members' largest look-back) and repeat bound ``C`` (their largest cap: ``allowed_length`` plus
llama.cpp's exponent clamp, at most ``W``):

1. the row's last ``W`` tokens (committed ones from ``all_token_ids``, this step's drafts from
   ``input_ids``); a column before the row's window (its look-back, or the prompt without
   ``include_prompt``) or holding a placeholder becomes a value of its own, equal to nothing;
2. breakers: each column's token looked up in the slot's sorted single-token breakers
   (``searchsorted``); the nearest one limits the repeats to the tokens after it;
3. match lengths: the window reversed and unfolded into ``[rows, W, C]`` (position ``p``'s ``C``
   tokens back from it) compared with the window's own last ``C`` tokens; the length is the first
   mismatch (``argmin`` over a trailing mismatch column), capped by the limit and the row's cap;
4. each position whose length is at least ``allowed_length`` penalizes the token after it (not a
   breaker, not a placeholder) by the slot's amount for that length (a table written at admission,
   ``multiplier * base ** exponent`` as llama.cpp computes it); every position's lowered value is
   computed as the host computes it and the rows take, per id, the lowest (``scatter_reduce_``
   ``amin``: the largest penalty, as the host's longest repeat), so a row equals the hosted path's.

That is the reference (``device_penalties`` then ``lower_rows``; ``dense_lower_`` from the window's
tensors), its memory ``rows * W * C`` bytes a few times (64 rows, ``W`` 2048, ``C`` 160: about 21 MB
each). The group runs the whole step as one fused op instead (``fused_lower_``, equal to it bit for
bit): on the CPU ``lower_window_`` (a compiled C step, ``dry_native``'s ``dry_window``: each row's
repeats as the Z-function of its reversed window; numpy for steps with drafts and until it has
loaded, only the positions holding a row's last token measured), on CUDA a Triton kernel (``dynlogits.kernels.dry``) and a
``scatter_reduce_``, two launches, where the kind's probe passed (``fused_ready``; else the
reference's ops, no sync either). Templates with multi-token breakers, or a cap above
``MAX_DEVICE_CAP`` (a base below about 1.42, or no clamp at all, base 1, with a look-back above it),
are hosted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from . import dry_native
from .device_thinking import NEVER
from .dry_lowering import host_f32_array
from .window import TokenWindow

__all__ = ["MAX_DEVICE_CAP", "Constants", "HostRows", "MAX_DEVICE_SINGLES", "NO_BREAKER", "StepArgs", "constants", "dense_lower_", "device_penalties",
           "fused_lower_", "fused_ready", "fused_run", "host_rows", "lower_rows", "lower_window_", "probe_case", "probe_floor",
           "reset_fused"]

#: The longest repeat measured on the device (``allowed_length`` plus the exponent clamp, at most the
#: look-back): base 1.75 with the default ``allowed_length`` is 160, base 1.5 is 220.
MAX_DEVICE_CAP = 256
#: Single-token breakers one slot may hold on the device (a breaker in many token texts, such as
#: ``"\n"``, matches thousands of ids).
MAX_DEVICE_SINGLES = 1 << 16
#: The value that pads a slot's sorted breakers (no token id reaches it).
NO_BREAKER = 1 << 62


Constants = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def constants(width: int, cap: int, device: torch.device) -> Constants:
    """What ``device_penalties`` reuses across steps for a window of ``width`` and a bound ``cap``:
    the columns ``0 .. width - 1`` and ``1 .. width``, the values standing for columns outside a
    window (``-1 - column``, each its own) and ``cap - 1`` more past them (padding the reversed
    window, equal to nothing)."""
    columns = torch.arange(width, device=device)
    return columns, columns + 1, -1 - columns, -1 - width - torch.arange(max(cap - 1, 0), device=device)


def device_penalties(window: TokenWindow, slot_of_row: torch.Tensor, member: torch.Tensor, params: torch.Tensor,
                     singles: torch.Tensor, amounts: torch.Tensor, width: int, cap: int,
                     consts: Constants, floor: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the ids after each of its last ``width - 1`` positions (``[rows, width - 1]``, a
    placeholder or a column outside the window read as 0) and each one's penalty (float64, 0 where
    the position penalizes nothing). ``params`` ``[rows, 4]``: allowed length, look-back, whether the
    prompt counts, the row's own cap; ``singles`` ``[rows, S]`` sorted; ``amounts`` ``[rows, T]``;
    ``floor`` (int64 per row, or ``None``): a row's window starts at ``max(start, floor[r])`` (a
    scoped entry's stretch: positions from the prompt's start)."""
    columns, counted, outside, pad = consts
    slots = window.slots(slot_of_row)
    pos = window.pos.long()
    at = (pos - (width - 1))[:, None] + columns  # [rows, W] positions
    tokens = window._read(slots, at.clamp(min=0)).long()
    allowed, lookback, with_prompt, own_cap = params[:, 0], params[:, 1], params[:, 2], params[:, 3]
    start = torch.maximum(pos + 1 - lookback, torch.where(with_prompt > 0, 0, window.prompt_len[slots].long()))
    if floor is not None:
        start = torch.maximum(start, floor)
    inside = (at >= start[:, None]) & (tokens >= 0)
    tokens = torch.where(inside, tokens, outside)  # each a value of its own
    found = torch.searchsorted(singles, tokens).clamp_(max=singles.shape[1] - 1)
    breaks = singles.gather(1, found) == tokens  # [rows, W]
    limit = torch.minimum(width - (counted * breaks).amax(1), own_cap)  # tokens after the nearest breaker (none: W)
    # lengths: the window reversed, unfolded ``cap`` back from every position, against its end
    backwards = torch.cat((tokens.flip(1), pad.expand(len(tokens), cap - 1)), 1)
    same = backwards.unfold(1, cap, 1) == backwards[:, None, :cap]  # [rows, W (q = W-1-p), C (k back)]
    stop = torch.cat((same, same.new_zeros(same.shape[0], width, 1)), 2).to(torch.uint8).argmin(2)
    lengths = torch.minimum(stop.flip(1), limit[:, None])[:, :-1]  # [rows, W-1]: positions before the end
    after = tokens[:, 1:]
    penalizes = (lengths >= allowed[:, None]) & (after >= 0) & ~breaks[:, 1:] & member[:, None]
    exponent = (lengths - allowed[:, None]).clamp_(0, amounts.shape[1] - 1)
    penalty = torch.where(penalizes, amounts.gather(1, exponent), 0.0)
    return after.clamp(min=0), penalty


def lower_rows(logits: torch.Tensor, ids: torch.Tensor, penalty: torch.Tensor) -> None:
    """Each row's logit at ``ids[r, j]`` lowered by ``penalty[r, j]`` as the hosted processor lowers
    it (at most the dtype's largest finite value, a finite logit kept finite, ``-inf`` kept), the
    largest penalty of an id winning (``amin`` over the lowered values)."""
    info = torch.finfo(logits.dtype)
    amount = penalty.clamp_max(info.max).to(logits.dtype)
    kept = logits.gather(1, ids)
    lowered = kept - amount
    torch.maximum(lowered, kept.clamp_max(info.min), out=lowered)
    logits.scatter_reduce_(1, ids, lowered, "amin")


# -- the whole step as one fused op: a fast exact CPU implementation, Triton kernels on CUDA -------------

#: a slot's breakers keyed per row (``row << KEY_SHIFT`` plus the id, ids clipped to ``KEY_CLIP``)
KEY_SHIFT, KEY_CLIP = 33, 1 << 32
#: ``lower_window_``'s padding after a reversed window (below every token and placeholder value)
PAD = -(1 << 30)
_F32_MAX = float(np.finfo(np.float32).max)
_F32_LOWEST = np.float32(np.finfo(np.float32).min)
#: kept across calls: the offsets ``1 - W .. 0`` per ``W``, the padding per shape (started over past 64)
_OFFSETS: dict[int, np.ndarray] = {}
_PADS: dict[tuple[int, int, str], np.ndarray] = {}


def dense_lower_(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                 input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                 member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor,
                 width: int, cap: int, floor: torch.Tensor | None = None) -> None:
    """The reference of ``fused_lower_`` (any device, no sync): ``device_penalties`` over the
    window ``(tokens, prompt_len, pos, input_ids, local_pos)`` with the slots' tables (``[slots,
    ...]``, read at ``slot_of_row``) and ``floor``, then ``lower_rows``."""
    window = TokenWindow(tokens.device).at(tokens, prompt_len, pos, input_ids, local_pos)
    ids, penalty = device_penalties(window, slot_of_row, member.bool(), params[slot_of_row], singles[slot_of_row],
                                    amounts[slot_of_row], width, cap, constants(width, cap, tokens.device), floor)
    lower_rows(logits, ids, penalty)


class HostRows(NamedTuple):
    """A layout's member rows for ``lower_window_`` on host tensors, read once from the slots'
    tables (``host_rows``; the group keeps it while its rows and tables hold): ``keep`` the member
    rows (``None``: every row), ``slots`` their slots, ``wslots`` their rows of the token matrix,
    ``at`` the flat index into that matrix of each one's window columns less its position (the
    step adds ``pos``), then per row its allowed length, ``1 - lookback``, whether the prompt lies
    outside its window, its cap at most ``W`` (``limit``), its sorted breakers keyed by row
    (``keyed``, ``None``: no member has one) and the amounts table; ``shape``: the ``(W, C, matrix
    shape)`` it was made for; ``first_w`` ``first + W - 1``, ``outside_any`` whether any row's
    prompt lies outside its window; ``table32`` the amounts as ``_lower_host`` lowers float32 logits
    by them (at most float32's largest, rounded to float32); ``native`` the rows as the native
    window step takes them (``dry_native``'s ``dry_window``: ``[rows, 8]`` int64) and ``packed``
    its address and ``table32``'s; ``shape`` ends with the member rows' count."""

    keep: np.ndarray | None
    slots: np.ndarray
    wslots: np.ndarray
    at: np.ndarray
    allowed: np.ndarray
    first: np.ndarray
    outside: np.ndarray
    limit: np.ndarray
    keyed: np.ndarray | None
    table: np.ndarray
    shape: tuple[int, int, int, int, int]
    first_w: np.ndarray
    outside_any: bool
    table32: np.ndarray
    packed: tuple[int, int]
    native: np.ndarray


def _offsets(w: int) -> np.ndarray:
    """The columns' offsets ``1 - W .. 0`` from a row's position (kept per ``W``)."""
    offsets = _OFFSETS.get(w)
    if offsets is None:
        offsets = _OFFSETS[w] = np.arange(1 - w, 1, dtype=np.int64)
    return offsets


def host_rows(member: torch.Tensor, slot_of_row: torch.Tensor, params: torch.Tensor, singles: torch.Tensor,
              amounts: torch.Tensor, width: int, cap: int, matrix: tuple[int, int]) -> HostRows | None:
    """``lower_window_``'s per-layout reads of host tables (``None``: no member row) for a token
    matrix of shape ``matrix``."""
    is_member = member.numpy()
    keep = None if bool(is_member.all()) else np.flatnonzero(is_member)
    if keep is not None and not len(keep):
        return None
    slots = slot_of_row.numpy() if keep is None else slot_of_row.numpy()[keep]
    prm = params.numpy()[slots]
    m, w = len(slots), width
    wslots = slots if matrix[0] >= params.shape[0] else np.minimum(slots, matrix[0] - 1)  # a slot past the window's rows
    keyed = None
    if singles.numpy()[slots, 0].min() < NO_BREAKER:  # a member has single-token breakers (each row sorted)
        rows_sorted = singles.numpy()[slots]
        keyed = (np.minimum(rows_sorted, KEY_CLIP) + (np.arange(m, dtype=np.int64) << KEY_SHIFT)[:, None]).ravel()
    first, outside, table = 1 - prm[:, 1], prm[:, 2] <= 0, amounts.numpy()
    limit = np.minimum(prm[:, 3], w)
    native = np.ascontiguousarray(np.stack((np.arange(m) if keep is None else keep, wslots, slots, prm[:, 1], outside,
                                            limit, prm[:, 0], np.where(singles.numpy()[slots, 0] < NO_BREAKER,
                                                                       singles.shape[1], 0)), 1), dtype=np.int64)
    table32 = _rounded32(table)
    return HostRows(keep, slots, wslots, (wslots * matrix[1])[:, None] + _offsets(w), prm[:, 0], first, outside,
                    limit, keyed, table, (w, cap, matrix[0], matrix[1], m), first + (w - 1),
                    bool(outside.any()), table32, (native.ctypes.data, table32.ctypes.data), native)


def lower_window_(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                  input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                  member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor,
                  width: int, cap: int, floor: torch.Tensor | None = None, rows: HostRows | None = None) -> None:
    """``dense_lower_`` on host tensors, bit for bit, without its ``[rows, W, C]`` tensors (numpy,
    shapes following the data): a member row's positions holding its last token are its only
    candidates; each one's repeat is the first mismatch (``argmin``) of its tokens back against the
    row's last ones (padded so that the last compare always fails; no further back than the
    farthest any candidate reaches inside its window), capped by the row's first column inside its
    window, the nearest breaker (in its last ``C`` columns: one before them limits nothing
    measured) and its cap; the hits lower the logits as ``lower_rows`` does, the largest penalty of
    an id winning (``_lower_host``). ``rows``: ``host_rows`` of these tables for ``(W, C)`` and this
    token matrix (``None``: read here). Needs every member's allowed length to be at least 1 (the
    spec's bound) and the logits' last dimension contiguous. A column before a row's window is
    read as anything: nothing there counts. A step without drafts runs compiled where it can
    (``_native_lowered``: the same bits), else the numpy steps below."""
    if width < 2:
        return
    w, c = width, min(cap, width)
    if rows is None:
        rows = host_rows(member, slot_of_row, params, singles, amounts, width, cap, (tokens.shape[0], tokens.shape[1]))
        if rows is None:
            return
    if (input_ids is None or local_pos is None) and _native_lowered(logits, tokens, prompt_len, pos, singles, width,
                                                                     cap, floor, rows):
        return
    tok = tokens.numpy()
    keep, m = rows.keep, len(rows.slots)
    pos_ = pos.numpy() if keep is None else pos.numpy()[keep]
    # the columns before every row's position 0 hold nothing that counts: the window is cut to the
    # last ``max(pos) + 1`` columns (a column keeps its distance back from its row's position)
    cut = w - min(w, int(pos_.max()) + 1)
    if cut:
        w, c = w - cut, min(c, w - cut)
        if w < 2:
            return
    if input_ids is not None and local_pos is not None:
        column = pos_[:, None] + _offsets(w)
        np.maximum(column, 0, out=column)
        win = tok[rows.wslots[:, None], column]
        ids = np.arange(len(pos)) if keep is None else keep
        back = pos_[:, None] - column
        fed = back <= (local_pos.numpy() if keep is None else local_pos.numpy()[keep])[:, None]
        if fed.any():
            win = np.where(fed, input_ids.numpy()[np.maximum(ids[:, None] - back, 0)], win)
    else:
        win = _windows(tok, rows, pos_, w, cut)
    if win.dtype != np.int32:
        win = win.astype(np.int64)
    # the first column inside each row's window (its look-back, the prompt unless it counts)
    if rows.outside_any:
        col0 = np.maximum(rows.first, prompt_len.numpy()[rows.wslots] * rows.outside - pos_)
        col0 += w - 1
    else:  # every row counts its prompt: its window starts at position 0 at the latest
        col0 = np.maximum(rows.first_w - cut if cut else rows.first_w, (w - 1) - pos_)
    if floor is not None:  # and its floor (``NEVER``: past every column)
        np.maximum(col0, (floor.numpy() if keep is None else floor.numpy()[keep]) - pos_ + (w - 1), out=col0)
    if win.min() < 0:  # placeholders: each a value of its own
        win = np.where(win >= 0, win, -1 - np.arange(w, dtype=win.dtype))
    limit, keyed = rows.limit, rows.keyed
    if keyed is not None:
        tail = win[:, w - c:].astype(np.int64)
        tail[np.arange(w - c, w) < col0[:, None]] = -1
        tail_breaks = _breaks(keyed, np.arange(m, dtype=np.int64)[:, None], tail)
        limit = np.minimum(w - np.where(tail_breaks, np.arange(w - c + 1, w + 1), 0).max(1), limit)
    ri, pi = np.nonzero(win[:, :-1] == win[:, -1:])
    if not len(ri):
        return
    reach = pi - col0[ri]
    top = int(reach.max())
    if top < 0:  # no candidate inside its window
        return
    c = min(c, top + 1)  # no repeat is measured past its window: no compare reaches further back
    pad = _PADS.get((m, w, win.dtype.char))
    if pad is None:
        if len(_PADS) > 64:
            _PADS.clear()
        pad = _PADS[(m, w, win.dtype.char)] = np.full((m, w + 1), PAD, dtype=win.dtype)
    backwards = np.concatenate((win[:, ::-1], pad[:, : c + 1]), 1)
    ends = backwards[:, : c + 1].copy()
    ends[:, c] = PAD - 1
    s0, s1 = backwards.strides
    view = np.ndarray((m, w + 1, c + 1), backwards.dtype, backwards, 0, (s0, s1, s1))
    length = (view[ri, w - 1 - pi] == ends[ri]).argmin(1)
    np.minimum(length, reach + 1, out=length)
    np.minimum(length, limit[ri], out=length)
    length -= rows.allowed[ri]  # the exponent, where at least 0
    after = win[ri, pi + 1]
    hit = np.flatnonzero((length >= 0) & (after >= 0))  # a hit's ``p + 1`` is inside (``reach >= 0``)
    if not len(hit):
        return
    ri, after, exponent = ri[hit], after[hit], length[hit]
    if keyed is not None:
        ok = np.flatnonzero(~_breaks(keyed, ri, after.astype(np.int64)))
        ri, after, exponent = ri[ok], after[ok], exponent[ok]
    rounded = logits.dtype == torch.float32 and logits.is_contiguous()
    table = rows.table32 if rounded else rows.table
    np.minimum(exponent, table.shape[1] - 1, out=exponent)  # at least 0: a hit's length reaches its allowed length
    penalty = table[rows.slots[ri], exponent]
    index = (ri if keep is None else keep[ri]) * logits.stride(0) + after
    _lower_host(logits, index, penalty, rounded=rounded)


def _native_lowered(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                    singles: torch.Tensor, width: int, cap: int, floor: torch.Tensor | None, rows: HostRows) -> bool:
    """``lower_window_``'s step (no drafts) by ``dry_native``'s compiled ``dry_window``, the same bits:
    each member row's repeats as the Z-function of its reversed window, O(window) per row whatever
    its repeats (the numpy path compares up to ``C`` tokens per candidate). ``False`` (nothing done)
    until the library has loaded or where it cannot run: not contiguous float32 logits, an int32
    token matrix, int32 prompt lengths, int32/int64 positions, int64 breakers and floors."""
    fn = dry_native.window_step()
    if (fn is None or logits.dtype != torch.float32 or not logits.is_contiguous() or tokens.dtype != torch.int32
            or not tokens.is_contiguous() or prompt_len.dtype != torch.int32 or not prompt_len.is_contiguous()
            or pos.dtype not in (torch.int32, torch.int64) or not pos.is_contiguous() or singles.dtype != torch.int64
            or not singles.is_contiguous() or (floor is not None and (floor.dtype != torch.int64 or not floor.is_contiguous()))):
        return False
    packed, table = rows.packed
    fn(rows.shape[4], packed, width, min(cap, width), tokens.data_ptr(), tokens.shape[1], pos.data_ptr(),
       pos.dtype == torch.int64, prompt_len.data_ptr(), 0 if floor is None else floor.data_ptr(), table,
       rows.table32.shape[1], singles.data_ptr(), singles.shape[1], logits.data_ptr(), logits.stride(0), logits.shape[1],
       *dry_native.window_scratch(logits.shape[1], width))
    return True


def _windows(tok: np.ndarray, rows: HostRows, pos: np.ndarray, w: int, cut: int) -> np.ndarray:
    """Each member row's last ``w`` columns up to its position ``pos`` (``[rows, w]``), from the
    token matrix ``tok``: one copy of a contiguous run per row (rows of a window over the flat
    matrix, no index per element) where every row's first column lies inside the matrix; else an
    element-wise ``take``, where a column before position 0 wraps to another row's tokens. A
    column before a row's position 0 is read as anything (another row's tokens): nothing there counts."""
    flat = tok.reshape(-1)
    starts = rows.wslots * tok.shape[1] + pos - (w - 1)
    if flat.flags.c_contiguous and len(flat) >= w and starts.min() >= 0:
        step = flat.strides[0]
        return np.ndarray((len(flat) - w + 1, w), flat.dtype, flat, 0, (step, step))[starts]
    at: np.ndarray = (rows.at[:, cut:] if cut else rows.at) + pos[:, None]
    return flat.take(at, mode="wrap")


def _rounded32(table: np.ndarray) -> np.ndarray:
    """``table`` as ``_lower_host`` lowers float32 logits by it: at most float32's largest, rounded to float32 (float64)."""
    out: np.ndarray = np.minimum(table, _F32_MAX).astype(np.float32).astype(np.float64)
    return out


def _lower_host(logits: torch.Tensor, index: np.ndarray, penalty: np.ndarray, *, rounded: bool = False) -> None:
    """The logits at the flat ``index`` (row times the row stride plus the id) lowered by
    ``penalty`` (float64, clamped to float32's largest) as ``lower_rows`` lowers them, the
    largest penalty of an index winning (``minimum.at``, as its ``scatter_reduce_`` ``amin``):
    contiguous float32 logits (vLLM's sampler's) through a numpy array over their memory
    (``dry_lowering.host_f32_array``: no ``Tensor.numpy`` call, tens of µs cold), the amount rounded
    to float32, the difference taken in float64 and floored at float32's lowest (``-inf`` kept),
    then rounded to float32 (the float32 difference: float64 holds over twice its precision);
    others with ``lower_rows``'s tensor ops over the flat logits (``scatter_reduce_``, ``amin``).
    ``rounded``: ``penalty`` is clamped and rounded already (``_rounded32``; float32 logits only)."""
    if logits.dtype != torch.float32 or not logits.is_contiguous():
        return _lower(logits, index, penalty)
    values = host_f32_array(logits.data_ptr(), logits.numel())
    kept = values[index]
    if not rounded:
        penalty = _rounded32(penalty)
    lowered = kept - penalty
    np.maximum(lowered, np.minimum(kept, _F32_LOWEST), out=lowered)  # finite stays finite, -inf stays
    np.minimum.at(values, index, lowered.astype(np.float32))
    return None


def _lower(logits: torch.Tensor, index: np.ndarray, penalty: np.ndarray) -> None:
    """``_lower_host`` with tensor ops (any dtype, any row stride)."""
    assert logits.stride(1) == 1, "logits: the vocabulary dimension must be contiguous"
    flat = logits.as_strided((logits.shape[0] * logits.stride(0),), (1,))
    index_t = torch.from_numpy(index)
    info = torch.finfo(logits.dtype)
    amount = torch.from_numpy(penalty).clamp_max(info.max).to(logits.dtype)
    kept = flat.index_select(0, index_t)
    lowered = kept - amount
    torch.maximum(lowered, kept.clamp_max(info.min), out=lowered)
    flat.scatter_reduce_(0, index_t, lowered, "amin")


def _breaks(keyed: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` (negative: outside, none) is one of its row's breakers (``keyed``:
    every row's sorted breakers, offset by the row)."""
    query = (rows << KEY_SHIFT) + np.where(values >= 0, values, KEY_CLIP + 1)
    found = np.minimum(np.searchsorted(keyed, query), len(keyed) - 1)
    out: np.ndarray = keyed[found] == query
    return out


from dynlogits.kernels.fused import fused_op  # noqa: E402
from dynlogits.kernels.probe import FusedGate  # noqa: E402
from dynlogits.kernels.variants import VariantOf  # noqa: E402


@fused_op("dry_lower_", launches=2, mutates_args=("logits",))
def fused_lower_(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                 input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                 member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor,
                 width: int, cap: int, floor: torch.Tensor | None = None) -> None:
    """The group's whole step under Model Runner V2: each member row's logits lowered as
    ``dense_lower_`` lowers them (``floor``, int64 per row or ``None``: a row's window starts at
    ``max(start, floor[r])``, a scoped entry's stretch). Every device but CUDA: ``lower_window_``. On CUDA two launches:
    one Triton kernel (``dynlogits.kernels.dry.decide``: each position's id and lowered value) and
    ``scatter_reduce_``."""
    lower_window_(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, singles,
                  amounts, width, cap, floor)


@fused_lower_.cuda
def _fused_lower_cuda(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                      input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                      member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor,
                      width: int, cap: int, floor: torch.Tensor | None = None) -> None:
    from dynlogits.kernels import dry as kernels

    ids, lowered = kernels.decide(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params,
                                  singles, amounts, width, cap, floor)
    logits.scatter_reduce_(1, ids, lowered, "amin")


def fused_ready(device: torch.device) -> bool:
    """Whether ``fused_lower_`` runs on ``device`` (``dynlogits.kernels.probe.FusedGate``): on CUDA
    once ``_probe`` passed (random windows with breakers, placeholders, drafts, non-finite logits,
    through the kernels and ``dense_lower_``, compared exactly), else one warning and
    ``dense_lower_``'s ops for good; always in the CUDA model; never on the CPU (where the group
    calls ``lower_window_`` itself)."""
    return _GATE.ready(device)


def fused_run(device: torch.device, fused: Callable[[], None], eager: Callable[[], None], variant_of: VariantOf,
              *args: Any) -> None:
    """``fused()`` where ``fused_ready(device)``, else ``eager()``; on CUDA named by the launch's
    ``variant_of(*args)`` (``kernels.dry.variant``), ``eager()`` until that variant has compiled off
    the step; a variant failing to compile turns the kernels off with one warning and runs
    ``eager()`` (``FusedGate.run_named``)."""
    _GATE.run_named(device, fused, eager, variant_of, *args)


#: ``fused_lower_``'s tensor arguments, in order
StepArgs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                 torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def probe_case(seed: int, rows: int = 12, slots: int = 6, max_len: int = 80, vocab: int = 40,
               drafts: bool = True) -> tuple[StepArgs, int, int]:
    """A random step (host tensors) for ``fused_lower_``'s arguments but ``width`` and ``cap``:
    few ids (repeats), breakers in some slots, placeholders, prompts counted or not, look-backs,
    caps and allowed lengths mixed, one non-member row, rows with drafts, ``-inf``, ``+inf`` and NaN
    logits; then ``width`` and ``cap``."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 5, (slots, max_len), generator=g, dtype=torch.int32)
    tokens[torch.rand(slots, max_len, generator=g) < 0.03] = -1
    prompt_len = torch.randint(0, max_len // 2, (slots,), generator=g, dtype=torch.int32)
    slot_of_row = torch.randint(0, slots + 1, (rows,), generator=g)  # slot ``slots``: the sentinel
    pos = torch.randint(0, max_len, (rows,), generator=g, dtype=torch.int32)
    local_pos = torch.randint(0, 3, (rows,), generator=g, dtype=torch.int32) if drafts else None
    input_ids = torch.randint(-1, 5, (rows,), generator=g, dtype=torch.int32) if drafts else None
    member = (torch.rand(rows, generator=g) < 0.85) & (slot_of_row < slots)
    width = 48
    caps = torch.randint(1, 30, (slots + 1,), generator=g)
    cap = int(caps.max())
    params = torch.stack((torch.randint(1, 4, (slots + 1,), generator=g), torch.randint(1, 70, (slots + 1,), generator=g),
                          torch.randint(0, 2, (slots + 1,), generator=g), caps), 1)
    singles = torch.full((slots + 1, 3), NO_BREAKER, dtype=torch.long)
    singles[1, :2] = torch.tensor([1, 3])
    singles[2, 0] = 4
    amounts = torch.rand(slots + 1, 9, generator=g, dtype=torch.float64).cumsum(1) * 3
    amounts[3, 4:] = 1e300  # past every dtype's largest
    logits = torch.randn(rows, 7, generator=g) * 3
    for row, value in list(enumerate((float("-inf"), float("inf"), float("nan"))))[:rows]:
        logits[row, 2 + row] = value
    return (logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, singles, amounts), width, cap


def probe_floor(seed: int, args: StepArgs) -> torch.Tensor:
    """Random per-row floors for ``probe_case``'s step ``args`` (int64, positions from the prompt's
    start): 0, ``NEVER`` (past every position: a row out of a scoped entry's phase), or a position
    around the row's own, its prompt's length among them."""
    g = torch.Generator().manual_seed(seed)
    pos = args[3].long()
    rows = len(pos)
    near = (pos - torch.randint(-2, 12, (rows,), generator=g)).clamp_(min=0)
    prompt = args[2].long()[args[6].clamp(max=len(args[2]) - 1)]
    pick = torch.randint(0, 4, (rows,), generator=g)
    return torch.where(pick == 0, 0, torch.where(pick == 1, NEVER, torch.where(pick == 2, prompt, near)))


def _probe(device: torch.device) -> bool:
    """``fused_lower_``'s kernels against ``dense_lower_`` on ``device``, exactly (``fused_ready``):
    float32 and bfloat16 logits, drafts or not, floors or not."""
    same = []
    for seed, drafts, floored in ((1, True, False), (2, False, False), (3, True, True)):
        args, width, cap = probe_case(seed, drafts=drafts)
        moved = cast(StepArgs, tuple(t.to(device) if t is not None else None for t in args))
        floor = probe_floor(seed, args).to(device) if floored else None
        for dtype in (torch.float32, torch.bfloat16):
            fused = moved[0].to(dtype)
            dense = fused.clone()
            _fused_lower_cuda(fused, *moved[1:], width, cap, floor)
            dense_lower_(dense, *moved[1:], width, cap, floor)
            same.append(torch.equal(fused.isnan(), dense.isnan()) and torch.equal(fused.nan_to_num(), dense.nan_to_num()))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
_GATE = FusedGate("dry", lambda device: _probe(device))


def reset_fused() -> None:
    """Forget every device's probe (tests)."""
    _GATE.reset()

