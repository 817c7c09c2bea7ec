"""``no_repeat_ngram`` decided on the device, from the step's ``TokenWindow`` (Model Runner V2: the
rows' histories live on the device): no history read back, no sync, nine device ops a steady step
without drafts (``addcmul``, ``index``, ``clamp``, ``bitwise_or``, ``bitwise_xor``, ``le``, ``all``,
``where``, ``scatter_reduce_``; ``apply``).

Per row of the step (gathered: every row, members masked), with a window of ``W`` tokens and the
group's largest size ``S`` (``window_width``: the widest history a member's kept sample can have,
at most the engine's matrix width, plus ``S - 1``), for logits ``V`` wide:

1. one ``addcmul`` of the layout's tables (``Layout``, gathered from ``SlotTables`` by one
   ``index`` per row mapping) with the rows' positions gives, per column, the position read (``at``:
   the row's last ``W`` positions, then its last ``S - 1`` again and its own: the *target* columns)
   and a bound ``U``: at least ``2**32`` where the column holds a token of the row's history, else
   below ``-2**33`` and distinct per column (before the history's start: position 0 with
   ``include_prompt``, else the prompt's length; a non-member row's start is past every position; a
   prefill chunk's row, fed before the prompt's last token, whose sample the runner discards, has
   none); the extra target column's ``U`` is ``INT64_MIN``;
2. the tokens at ``at`` (``TokenWindow._read``), and one ``clamp`` on two planes: ``key =
   minimum(token, U)`` (the token where it is the history's, else a value of its own: the matrix is
   int32, no token lies below ``-2**31``; a placeholder, ``-1``, stays ``-1``) and ``ids =
   clamp(token, 0, V - 1)``, the ids a ban may write;
3. the target: the key's target columns with the sign bit set (``| INT64_MIN``): a token ``t`` of
   the row's last ``S - 1`` becomes ``t ^ INT64_MIN``, a placeholder or a position outside the
   history stays negative (its sign bit is set already), the extra column ``INT64_MIN``; each
   window of ``S`` columns (``S - 1`` tokens and the one after them) is xored with it (``x``);
4. a window bans the token after it when, in every column, ``x <= LIMIT``: ``INT64_MIN`` where the
   row's own ``size - 1`` tokens are compared (``x`` is ``INT64_MIN`` only where the window's token
   equals a token of the tail: a placeholder or an outside position in the tail equals nothing, one
   in the window equals no tail token), ``INT64_MIN + V - 1`` in the last column (``x = key ^
   INT64_MIN`` is at most that only for a key in ``[0, V)``: a token of the history inside the
   logits width, never a placeholder), ``INT64_MAX`` in the columns before a smaller member's own
   ``size - 1`` (ignored);
5. every ban written with one ``scatter_reduce_`` at ``ids`` (``amin``: ``-inf`` at a ban, ``+inf``
   elsewhere, so repeats and non-members leave logits as they are).

The row equals ``banned_after(history, size)`` (transformers' ``NoRepeatNGramLogitsProcessor``),
``history`` the prompt and the output with ``include_prompt``, else the output, for every row whose
history fits the window (every row whose sample the runner keeps, where each member's
``positions`` or ``outputs`` is known; see ``window_width``).

Work per step (the device-work bound): ``rows * (W - S + 1) * S`` int64 xors and compares plus a few
``[rows, W + S]`` tensors, ``S <= 8``; ``W`` is the members' longest kept history (``max_tokens``
without ``include_prompt``) rather than the engine's matrix width where every member's bound is
known. Sizes above ``MAX_DEVICE_SIZE`` are hosted (``NoRepeatNgramGroup.fits_window``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .window import TokenWindow

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_DEVICE_SIZE", "NEVER", "Layout", "SlotTables", "apply", "layout", "slot_tables",
           "window_width"]

#: The largest ``size`` decided on the device: each step compares ``rows * W * size`` cells; common
#: settings are 2 to 5 (transformers', TensorRT-LLM's). Larger sizes are hosted.
MAX_DEVICE_SIZE = 8
#: A history start (and a bound on positions) past every position an engine reaches: a non-member
#: row starts here, so it bans nothing; small enough that ``BIG * NEVER`` fits in int64.
NEVER = 1 << 26
#: ``U``'s scale: a position inside the history gives ``U >= 2**32`` (above every token), one
#: outside ``U <= -BIG + 2**32 + columns < -2**33`` (below every int32 value).
BIG = 1 << 34
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
#: ``SlotTables.planes``: the column offsets, ``U``'s fixed part, the ids' upper bound (``V - 1``), the
#: multipliers of the position for those three (``addcmul``), the slot within the engine's, and
#: each window column's limit (the first ``S`` columns).
_AT, _BOUND, _TOP, _SCALE, _SLOT, _LIMIT = 0, 1, 2, 3, 6, 7


def window_width(matrix_width: int, spans: list[int | None], size: int) -> int:
    """``W``: the longest history a member's kept sample sees (``spans``: prompt plus ``max_tokens``
    with ``include_prompt``, else ``max_tokens``; ``None``: unknown), at most the engine's matrix
    width (where any is unknown: that width), plus ``size - 1``, so every history token can follow a
    window of the largest size (the columns before position 0 read the row's own: see
    ``slot_tables``). A row past its bound is one whose sample the runner discards: it sees the last
    ``W - size + 1`` positions of its history, so masks a subset of its ids."""
    width = matrix_width
    if spans and None not in spans:
        width = min(width, max(n for n in spans if n is not None))
    return max(width, 1) + size - 1


@dataclass(frozen=True)
class SlotTables:
    """The group's tables per slot, for a window ``W`` wide, the largest size ``S`` and logits
    ``vocab`` wide: ``planes`` ``[8, slots, W + S]`` (``_AT`` .. ``_LIMIT``); ``low`` ``[2, 1, 1]``
    the two planes' lower bounds of the ``clamp``."""

    width: int
    size: int
    vocab: int
    planes: torch.Tensor
    low: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """A layout's tables, gathered from ``SlotTables.planes`` by ``slot_of_row`` (one ``index``):
    ``addcmul(tables, pos, multiplier)`` is ``(at, U, V - 1)``; ``slots`` the rows' slots within the
    engine's; ``limit`` ``[rows, 1, S]``."""

    source: SlotTables
    slot_of_row: torch.Tensor
    tables: torch.Tensor
    multiplier: torch.Tensor
    slots: torch.Tensor
    limit: torch.Tensor


def slot_tables(window: TokenWindow, member: torch.Tensor, params: torch.Tensor, width: int, size: int,
                vocab: int) -> SlotTables:
    """The tables of every slot (device ops, once per change of the group's tables, no sync).
    ``member``: whether the slot is the group's; ``params`` ``[slots, 2]``: each slot's size and
    whether its prompt counts."""
    device = member.device
    w, s, n = width, size, member.shape[0]
    engine = torch.arange(n, device=device).clamp(max=window.tokens.shape[0] - 1)  # as TokenWindow.slots
    prompt_len = window.prompt_len[engine].long()
    start = torch.where(member, torch.where(params[:, 1] > 0, 0, prompt_len), NEVER)
    sizes = torch.where(member, params[:, 0], s)
    # each column's offset from the row's position: the window, then the tail, then the row's own
    offsets = torch.cat([torch.arange(1 - w, 1, device=device), torch.arange(2 - s, 1, device=device),
                         torch.zeros(1, dtype=torch.long, device=device)])
    columns = torch.arange(w + s, device=device)
    # a column holds a history token iff pos >= bound: at >= start, and not a prefill chunk's row
    bound = torch.maximum(start[:, None] - offsets[None, :], (prompt_len - 1)[:, None]).clamp(max=NEVER)
    fixed = (1 << 32) + columns[None, :] - BIG * bound
    # target columns that compare nothing: the extra one, and those before a member's own size - 1
    j = torch.arange(s, device=device)
    compared = j[None, :] >= (s - sizes)[:, None]
    free = torch.cat([torch.zeros(n, w, dtype=torch.bool, device=device), ~compared | (j[None, :] == s - 1)], dim=1)
    limit = torch.where(j[None, :] == s - 1, INT64_MIN + vocab - 1, torch.where(compared, INT64_MIN, INT64_MAX))
    zeros = torch.zeros(n, w + s, dtype=torch.long, device=device)
    # a column before position 0 at every position the matrix holds reads one inside it (outside the history anyway)
    reads = offsets.clamp(min=1 - window.tokens.shape[1])
    planes = torch.stack([reads[None, :].expand(n, -1), torch.where(free, INT64_MIN, fixed), zeros + (vocab - 1),
                          zeros + 1, torch.where(free, 0, BIG), zeros, engine[:, None].expand(-1, w + s),
                          torch.cat([limit, zeros[:, s:]], dim=1)])
    low = torch.where(torch.arange(2, device=device) == 0, INT64_MIN, 0).view(2, 1, 1)  # built here: no host data
    return SlotTables(w, s, vocab, planes, low)


def layout(t: SlotTables, slot_of_row: torch.Tensor) -> Layout:
    """A layout's rows' tables: one ``index`` of ``t.planes``."""
    rows = t.planes[:, slot_of_row]
    return Layout(t, slot_of_row, rows[_AT:_SCALE], rows[_SCALE:_SLOT], rows[_SLOT, :, 0], rows[_LIMIT, :, None, :t.size])


def apply(window: TokenWindow, t: Layout, logits: torch.Tensor, extremes: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``-inf`` in ``logits`` at every id a row's history bans (see the module doc): nine device ops,
    no sync. ``extremes``: ``-inf`` and ``+inf`` in the logits' dtype, on their device."""
    w, s = t.source.width, t.source.size
    read = torch.addcmul(t.tables, window.pos[None, :, None], t.multiplier)  # at, U, V - 1
    both = torch.clamp(window._read(t.slots, read[0])[None], min=t.source.low, max=read[1:])  # key, ids
    key, ids = both[0], both[1]
    x = torch.bitwise_xor(key[:, :w].unfold(1, s, 1), torch.bitwise_or(key[:, w:], INT64_MIN)[:, None, :])
    hit = torch.le(x, t.limit).all(2)
    logits.scatter_reduce_(1, ids[:, s - 1:w], torch.where(hit, *extremes), reduce="amin")
