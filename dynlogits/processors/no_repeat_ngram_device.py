"""``no_repeat_ngram`` decided on the device, from the step's ``TokenWindow`` (Model Runner V2: the
rows' histories live on the device): no history read back, no sync. ``apply`` runs one of three
implementations of the same bans:

* the fused op ``ban_`` (``dynlogits::no_repeat_ngram_ban_``): on CUDA one Triton launch
  (``dynlogits.kernels.no_repeat_ngram``), where ``fused_ready`` (probed once per device against
  ``apply_eager``; in the CUDA model always), so a steady step is one launch;
* on the CPU, its CPU implementation (``ban_host``: numpy over the rows' windows) called directly,
  the rows' params gathered once per layout (``Layout.host``);
* elsewhere (a CUDA device whose probe failed) ``apply_eager``: nine device ops a steady step
  without drafts (``addcmul``, ``index``, ``clamp``, ``bitwise_or``, ``bitwise_xor``, ``le``,
  ``all``, ``where``, ``scatter_reduce_``), described below.

A scoped entry's rows (``scope.ScopedDecided``) read the same matrix in place, each with a floor
(``floor``: per row, the first position of its phase's stretch, from the prompt's start; past every
position for a row out of its phase): a position below it holds no token of the row's history
(``max(start, floor)`` for the history's start below), by the same three implementations.

Per row of the step (gathered: every row, members masked), with a window of ``W`` tokens and the
group's largest size ``S`` (``window_width``: the widest history a member's kept sample can have,
at most the engine's matrix width, plus ``S - 1``), for logits ``V`` wide:

1. one ``addcmul`` of the layout's tables (``Layout``, gathered from ``SlotTables`` by one
   ``index`` per row mapping) with the rows' positions gives, per column, the position read (``at``:
   the row's last ``W`` positions, then its last ``S - 1`` again and its own: the *target* columns)
   and a bound ``U``: at least ``2**32`` where the column holds a token of the row's history, else
   below ``-2**33`` and distinct per column (before the history's start: position 0 with
   ``include_prompt``, else the prompt's length, or the row's ``floor`` where later; a non-member
   row's start is past every position; a prefill chunk's row, fed before the prompt's last token,
   whose sample the runner discards, has none); the extra target column's ``U`` is ``INT64_MIN``
   (a floor adds four ops: ``U`` lowered to ``2**32 + column + BIG * (at - floor)`` where that is
   lower, the floor clamped to ``NEVER``);
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

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dynlogits.kernels import no_repeat_ngram as no_repeat_ngram_kernels
from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .no_repeat_ngram_native import ban_native
from .window import TokenWindow

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_DEVICE_SIZE", "NEVER", "Layout", "SlotTables", "apply", "apply_eager", "ban_",
           "ban_host", "fused_ready", "layout", "probe_case", "reset_fused", "slot_tables", "window_width"]

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
    ``vocab`` wide: ``planes`` ``[8, slots, W + S]`` (``_AT`` .. ``_LIMIT``, the eager device path);
    ``low`` ``[2, 1, 1]`` the two planes' lower bounds of the ``clamp``; ``columns`` ``[W + S]``,
    ``2**32 + column`` (a floor's ``U``, the eager path); ``params`` ``[slots, 4]``
    int64 (``ban_``'s): the history's first position (``NEVER``: not a member), the size, the first
    position a row decides at (the prompt's last: a prefill chunk's row before it bans nothing),
    the slot within the engine's."""

    width: int
    size: int
    vocab: int
    planes: torch.Tensor
    low: torch.Tensor
    columns: torch.Tensor
    params: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """A layout's rows (``slot_of_row``) over ``source``; ``gathered`` (the eager device path only,
    made at its first use: one ``index``) its rows' planes: ``addcmul(tables, pos, multiplier)`` is
    ``(at, U, V - 1)``; ``slots`` the rows' slots within the engine's; ``limit`` ``[rows, 1, S]``;
    ``host`` (the CPU path) its rows' params on the host. Both are kept while the layout is: as the
    group's cache, they assume ``slot_of_row`` and the tables are not written in place meanwhile."""

    source: SlotTables
    slot_of_row: torch.Tensor

    @functools.cached_property
    def gathered(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tables, multiplier, slots, limit)``: one ``index`` of ``source.planes``."""
        rows = self.source.planes[:, self.slot_of_row]
        return rows[_AT:_SCALE], rows[_SCALE:_SLOT], rows[_SLOT, :, 0], rows[_LIMIT, :, None, :self.source.size]

    def host(self, matrix_width: int) -> _HostRows:
        """(CPU tensors only) the rows' ``SlotTables.params`` as numpy columns (``_host_rows``), made
        once per layout and engine matrix width."""
        made: _HostRows | None = self.__dict__.get("_host")
        if made is None or made.matrix_width != matrix_width:
            made = _host_rows(self.source.params.numpy(), self.slot_of_row.numpy(), self.source.size, matrix_width,
                              self.source.width)
            self.__dict__["_host"] = made  # a frozen dataclass: its cache set as functools.cached_property does
        return made


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
    compact = torch.stack([start, sizes, prompt_len - 1, engine], dim=1).contiguous()
    return SlotTables(w, s, vocab, planes, low, (1 << 32) + columns, compact)


def layout(t: SlotTables, slot_of_row: torch.Tensor) -> Layout:
    """A layout's rows over ``t`` (no device op: the eager path gathers at its first use)."""
    return Layout(t, slot_of_row)


def apply(window: TokenWindow, t: Layout, logits: torch.Tensor, extremes: tuple[torch.Tensor, torch.Tensor],
          floor: torch.Tensor | None = None) -> None:
    """``-inf`` in ``logits`` at every id a row's history bans, no sync: on the CPU ``ban_``'s CPU
    implementation called directly (its rows' params gathered once per layout: ``Layout.host``);
    where ``fused_ready`` (CUDA once probed, the CUDA model) the fused op ``ban_`` (one Triton
    launch; on CUDA a kernel variant not compiled yet compiles off the step, ``apply_eager``
    answering until it lands: ``FusedGate.run``); else, or once a call of it failed on CUDA,
    ``apply_eager``. ``floor`` (int64, per row):
    no position below it is the row's history (a scoped entry's stretch)."""
    drafts = window.input_ids is not None and window.local_pos is not None
    ids, local = (window.input_ids, window.local_pos) if drafts else (None, None)
    if logits.device.type == "cpu":
        _ban_host(logits, window.tokens, window.pos, t.host(window.tokens.shape[1]), ids, local, floor, t.source.width,
                  t.source.size)
    else:  # a new variant (SIZE, drafts, floor, dtypes) compiles off the step, eager until it lands
        _gated(logits.device, (logits, window.tokens, window.pos, t.slot_of_row, t.source.params, ids, local, floor,
                               t.source.width, t.source.size),
               lambda: apply_eager(window, t, logits, extremes, floor))


_BanArgs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                 torch.Tensor | None, torch.Tensor | None, int, int]


def _gated(device: torch.device, args: _BanArgs, eager: Callable[[], None]) -> None:
    """``ban_(*args)`` through the gate: on CUDA named by its variant (``kernels.no_repeat_ngram.variant``),
    so a variant not compiled yet compiles off the step and ``eager()`` answers until it lands."""
    _GATE.run_named(device, lambda: ban_(*args), eager, no_repeat_ngram_kernels.variant, *args)


def apply_eager(window: TokenWindow, t: Layout, logits: torch.Tensor, extremes: tuple[torch.Tensor, torch.Tensor],
                floor: torch.Tensor | None = None) -> None:
    """The eager device path (see the module doc): nine device ops (ten on a layout's first step,
    four more with a ``floor``), no sync. ``extremes``: ``-inf`` and ``+inf`` in the logits' dtype,
    on their device. A logit that is NaN stays NaN where it is banned (``amin``); every other ban
    is ``-inf``."""
    w, s = t.source.width, t.source.size
    tables, multiplier, slots, limit = t.gathered
    read = torch.addcmul(tables, window.pos[None, :, None], multiplier)  # at, U, V - 1
    if floor is not None:  # a column before the row's floor: U below every token, its own per column
        below = torch.sub(read[0], floor.clamp(max=NEVER)[:, None])
        torch.minimum(read[1], torch.add(t.source.columns, below, alpha=BIG), out=read[1])
    both = torch.clamp(window._read(slots, read[0])[None], min=t.source.low, max=read[1:])  # key, ids
    key, ids = both[0], both[1]
    x = torch.bitwise_xor(key[:, :w].unfold(1, s, 1), torch.bitwise_or(key[:, w:], INT64_MIN)[:, None, :])
    hit = torch.le(x, limit).all(2)
    logits.scatter_reduce_(1, ids[:, s - 1:w], torch.where(hit, *extremes), reduce="amin")


@functools.lru_cache(maxsize=32)
def _columns(width: int) -> tuple[np.ndarray, np.ndarray]:
    """A window's column offsets ``1 - width .. 0`` and each column's own value below every token (int32)."""
    offsets = np.arange(1 - width, 1, dtype=np.int32)
    return offsets, offsets - 1 - (1 << 30)


@dataclass(frozen=True)
class _HostRows:
    """A layout's rows for ``_ban_rows`` (numpy, from ``SlotTables.params``), for an engine matrix
    ``matrix_width`` wide: each row's size, its slot's first flat index in the matrix, the flat
    index of its history's first position (``NEVER`` past it where not a member), the first
    position it decides at; whether a row counts its prompt (so a prefill chunk's row must be
    checked) and whether any row's size is below the tables' largest; then, for a window ``width``
    columns wide, each column's flat index at position 0 (``columns``, ``[rows, width]``) and
    ``start`` as a column (``[rows, 1]``): a step's calls made once per layout."""

    matrix_width: int
    sizes: np.ndarray
    base: np.ndarray
    start: np.ndarray
    first: np.ndarray
    prompts: bool
    smaller: bool
    columns: np.ndarray
    start_column: np.ndarray
    packed: np.ndarray
    packed_at: int


def _host_rows(params: np.ndarray, slot_of_row: np.ndarray, size: int, matrix_width: int, width: int) -> _HostRows:
    start, n, first, engine = params.take(slot_of_row, axis=0).T
    base = engine * matrix_width
    begins = base + start
    packed = np.ascontiguousarray(np.stack((n, engine, start, first), 1), dtype=np.int64)  # ``ban_native``'s rows
    # a Python min: cheaper cold than numpy's
    return _HostRows(matrix_width, n, base, begins, first, bool((start <= first).any()),
                     min(n.tolist(), default=size) < size, base[:, None] + _columns(width)[0], begins[:, None], packed,
                     packed.ctypes.data)


def _host_ban(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
              params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
              floor: torch.Tensor | None, width: int, size: int) -> None:
    """``ban_``'s CPU implementation (host tensors): ``_ban_host``."""
    rows = _host_rows(params.numpy(), slot_of_row.numpy(), size, tokens.shape[1], width)
    _ban_host(logits, tokens, pos, rows, input_ids, local_pos, floor, width, size)


def _ban_host(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, rows: _HostRows,
              input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, floor: torch.Tensor | None, width: int,
              size: int) -> None:
    """The bans of ``_ban_rows`` on host tensors: compiled where it can run (``no_repeat_ngram_native``:
    a step without drafts), else numpy."""
    if (input_ids is None or local_pos is None) and ban_native(logits, tokens, pos, rows.packed, rows.packed_at, floor,
                                                               NEVER, width, size):
        return
    _ban_rows(logits, tokens.numpy(), pos.numpy(), rows, None if input_ids is None else input_ids.numpy(),
              None if local_pos is None else local_pos.numpy(), None if floor is None else floor.numpy(), width, size)


def _ban_rows(logits: torch.Tensor, matrix: np.ndarray, p: np.ndarray, rows: _HostRows, input_ids: np.ndarray | None,
              local_pos: np.ndarray | None, floor: np.ndarray | None, width: int, size: int) -> None:
    """The bans of ``ban_`` on host data: numpy over ``[rows, width]`` columns (few, cheap calls: the
    step runs right after the logits were written, its caches cold), a column's ``key`` its token
    where that counts (inside the history, not negative) else a value of its own below every token,
    the bans written with one fancy assignment."""
    offsets, outside = _columns(width)
    at = rows.columns + p[:, None]  # flat indices into the matrix
    if floor is None and not rows.prompts:
        start = rows.start_column
    else:
        start = rows.start if floor is None else np.maximum(rows.start, rows.base + np.minimum(floor, NEVER))
        start = (np.where(p >= rows.first, start, 1 << 62) if rows.prompts else start)[:, None]  # a prefill chunk's row: none
    # a column before position 0 reads anything (outside the history): wrap keeps every index inside the matrix
    tok = matrix.take(at, mode="wrap")  # no axis: the flattened matrix
    if input_ids is not None and local_pos is not None:
        fed = -offsets <= local_pos[:, None]  # fed at row r + offset: the last committed token or a draft
        source = np.maximum(np.arange(len(p))[:, None] + offsets, 0)
        tok = np.where(fed, input_ids.take(source), tok)
    key = np.where((at >= start) & (tok >= 0), tok, outside)
    w, s = width, size
    follower = key[:, s - 1:]
    unsigned: np.ndarray = follower.view(np.uint32 if key.itemsize == 4 else np.uint64)
    hit = unsigned < logits.shape[1]  # counted (a negative key is past every id unsigned), inside the logits
    for k in range(1, s):
        same = key[:, s - 1 - k:w - k] == key[:, w - k, None]  # the token k before each follower: the tail's
        hit &= (same | (rows.sizes <= k)[:, None]) if rows.smaller else same
    row, column = hit.nonzero()
    if row.size:
        ids = follower[row, column]
        if logits.dtype == torch.float32 and not logits.requires_grad:
            logits.numpy()[row, ids] = -np.inf
        else:
            logits.index_put_((torch.from_numpy(row), torch.from_numpy(ids.astype(np.int64))),
                              torch.full((), float("-inf"), dtype=logits.dtype))


# -- the fused op (``dynlogits.kernels``): the whole step as one Triton kernel on CUDA --

@fused_op("no_repeat_ngram_ban_", launches=1, mutates_args=("logits",))
def ban_(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor, params: torch.Tensor,
         input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, floor: torch.Tensor | None, width: int,
         size: int) -> None:
    """``-inf`` in ``logits`` at every id each row's history bans: exactly the bans of
    ``apply_eager`` for the same window, tables and ``floor`` (int64 per row, or ``None``: a row's
    history starts at ``max(start, floor)``) (``params``: ``SlotTables.params``; ``width``,
    ``size``: the tables'), and where a row's history fits the window, transformers'
    ``NoRepeatNGramLogitsProcessor`` with placeholder n-grams skipped (``banned_after``), ids past the
    logits' width left alone. Every ban is ``-inf`` (a NaN logit too). CPU implementation (every
    device but CUDA): ``_host_ban``, host tensors only; CUDA: one Triton launch
    (``dynlogits.kernels.no_repeat_ngram.ban_``)."""
    _host_ban(logits, tokens, pos, slot_of_row, params, input_ids, local_pos, floor, width, size)


@ban_.cuda
def _ban_cuda(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
              params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
              floor: torch.Tensor | None, width: int, size: int) -> None:
    from dynlogits.kernels import no_repeat_ngram as kernels

    kernels.ban_(logits, tokens, pos, slot_of_row, params, input_ids, local_pos, floor, width, size)


#: ``ban_``'s CPU implementation, called directly on the CPU (no dispatcher)
ban_host = ban_.eager


def fused_ready(device: torch.device) -> bool:
    """Whether ``ban_`` runs on ``device`` (``dynlogits.kernels.probe.FusedGate``): never on the
    CPU, always in the CUDA model, on CUDA once ``_probe`` passed (random windows, drafts or not,
    through the kernel and ``apply_eager`` on that device, logits compared exactly); else one
    warning and ``apply_eager`` for good."""
    return _GATE.ready(device)


def probe_case(seed: int, device: torch.device, *, rows: int = 12, slots: int = 9, length: int = 40, vocab: int = 50,
               drafts: int = 0) -> tuple[TokenWindow, Layout, torch.Tensor, torch.Tensor]:
    """A random step on ``device``: an engine's token matrix of few ids (repeats are common) with
    placeholders and ids past ``vocab``, prompts, rows at random positions (some in prefill, some
    past the window, some not members), mixed sizes up to ``MAX_DEVICE_SIZE`` and ``include_prompt``,
    ``drafts`` drafts per request at most; its window, layout, logits (no NaN) and a floor per row
    (a scoped entry's: anywhere from before the prompt to past the row, some past every position)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 4, (slots, length), generator=g, dtype=torch.int32)
    tokens[torch.rand(slots, length, generator=g) < 0.03] = -1
    past = torch.rand(slots, length, generator=g) < 0.04  # ids at and past the logits' width
    tokens[past] = vocab + torch.randint(0, 3, (int(past.sum()),), generator=g, dtype=torch.int32)
    prompt_len = torch.randint(1, length // 2, (slots,), generator=g, dtype=torch.int32)
    slot_of_row = torch.randint(0, slots + 1, (rows,), generator=g)  # slots: the tables' sentinel (never a member)
    pos = torch.minimum(torch.randint(0, length, (rows,), generator=g), torch.tensor(length - 1))
    member = torch.rand(slots + 1, generator=g) < 0.8
    member[-1] = False
    size = int(torch.randint(1, MAX_DEVICE_SIZE + 1, (1,), generator=g))
    params = torch.stack([torch.randint(1, size + 1, (slots + 1,), generator=g),
                          torch.randint(0, 2, (slots + 1,), generator=g)], dim=1)
    window = TokenWindow(device)
    input_ids = local_pos = None
    if drafts:
        local_pos = torch.randint(0, drafts + 1, (rows,), generator=g)
        input_ids = torch.randint(-1, 5, (rows,), generator=g, dtype=torch.int32)
    window.at(tokens.to(device), prompt_len.to(device), pos.to(device),
              None if input_ids is None else input_ids.to(device), None if local_pos is None else local_pos.to(device))
    width = window_width(length, [int(x) for x in torch.randint(1, length, (2,), generator=g)], size)
    tables = slot_tables(window, member.to(device), params.to(device), width, size, vocab)
    logits = torch.randn(rows, vocab, generator=g).to(device)
    floor = torch.randint(-2, length + 2, (rows,), generator=g)
    floor[torch.rand(rows, generator=g) < 0.15] = 1 << 62  # out of its phase (``scope.FloorScopeTables``)
    return window, layout(tables, slot_of_row.to(device)), logits, floor.to(device)


def _probe(device: torch.device) -> bool:
    """``ban_``'s kernel against ``apply_eager`` on ``device``, exactly (see ``fused_ready``), floors
    or none."""
    same = []
    for seed, drafts in ((1, 0), (2, 2), (3, 0), (4, 3)):
        window, t, logits, floor = probe_case(20260500 + seed, device, drafts=drafts)
        floored = floor if seed % 2 else None
        fused, eager = logits.clone(), logits.clone()
        extremes = (torch.full((), float("-inf"), device=device), torch.full((), float("inf"), device=device))
        apply_eager(window, t, eager, extremes, floored)
        drafted = drafts > 0
        _ban_cuda(fused, window.tokens, window.pos, t.slot_of_row, t.source.params,
                  window.input_ids if drafted else None, window.local_pos if drafted else None, floored,
                  t.source.width, t.source.size)
        same.append(torch.equal(fused, eager))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
_GATE = FusedGate("no_repeat_ngram", lambda device: _probe(device))


def reset_fused() -> None:
    """Forget every device's probe (tests)."""
    _GATE.reset()
