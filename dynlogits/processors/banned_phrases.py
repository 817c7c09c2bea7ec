"""``banned_phrases``: a phrase's last token is masked whenever the output ends with the rest of it:
the processor, its template and its resident group.

Per step and row: a walk back from the output's last token over the phrases' prefixes read
backwards (a trie), at most one lookup per token of the longest prefix, never a scan of the
history or of every phrase; a row whose last token ends no prefix costs one lookup. On the
resident path with host histories (vLLM's V1 runner) the group's host work is that lookup per row,
its device work one masked write: of the one-token phrases (indices uploaded once per layout) or,
on steps that find ids, of those and the found ones in one upload (host logits of a numpy dtype:
one numpy assignment through their memory, no torch op). Where the histories live on the device
(Model Runner V2) the group compares each row's last tokens (``TokenWindow``) with every phrase of
its slot at once, no read back: one fused op a step (``dynlogits::banned_phrases_ban_``, one Triton
launch on CUDA once ``dynlogits.kernels.banned_phrases.GATE`` probed it), else a fixed number of
eager device ops (``decide_from_window``); on the CPU (no device to keep busy) each row's last token
is read from the window and looked up in its trie instead, and only the rows that hit are walked
back over the window, as with host histories.

A scoped entry (``scope.ScopedDecided``) is resident on both runners: with host histories each
row walks its phase's stretch and a row out of phase (``neutral_history``) masks nothing, its
one-token phrases neither (``_decide_scoped``); from the window, the same fused op with each row's
floor, its stretch's start (``apply_floored``: a prefix matches only inside the stretch).

A processor's tables (the one-token phrases, the trie, the template) depend on the phrases alone
and never change: they are built once per phrase set and shared (``TABLES_KEPT``), so a ban list
repeated across requests costs a lookup at realization, not a build."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import add, itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeAlias

import numpy as np
import torch

from dynlogits.kernels import banned_phrases as banned_phrases_kernels
from dynlogits.kernels.banned_phrases import GATE, banned_phrases_ban_
from dynlogits.kernels.banned_phrases import NEVER as _NEVER
from dynlogits.specs.builtin.banned_phrases import BannedPhrases, BannedPhrasesSpec

from .banned_tokens import BannedTokensTemplate
from .base import IndexCache, RealizeContext
from .entries import EntryTablesGroup
from .kept import INT_BYTES, Kept, deep_size, shallow_size
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, GatheredRows, ListedRows, SlotTable, StepInputs, Template
from .uploads import StepUpload, on_accelerator

if TYPE_CHECKING:
    from .window import TokenWindow

__all__ = ["KIND", "TABLES_BYTES", "TABLES_KEPT", "BannedPhrasesGroup", "BannedPhrasesProcessor", "BannedPhrasesTemplate", "factory",
           "masked_after"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = BannedPhrasesSpec | BannedPhrases

KIND = "banned_phrases"

#: Distinct sets of ids one request masks, whose index tensors are kept (beyond it, rebuilt).
KEPT_SETS = 64
#: Phrase sets whose tables are kept, least recently used dropped first: at most ``TABLES_KEPT``
#: sets holding at most ``TABLES_BYTES`` bytes in all, their phrases included (``deep_size``; the
#: tables' ids are the phrases', counted once): 256 phrases of 64 tokens take ~5 MiB.
TABLES_KEPT = 64
TABLES_BYTES = 16 << 20


class _Tables(NamedTuple):
    """What a phrase set's processors share, read only: its one-token phrases, its prefixes as a
    trie read backwards from their last token (token -> its node, ``_node``: a node is one tuple,
    a leaf holds no dict and neither does a node with one token before it, so a walk touches few
    objects), its template, and the bytes all that holds beyond the phrases' ids (``size``: counted
    as it is built, one pass over its nodes)."""

    always: tuple[int, ...]
    tails: dict[int, tuple]
    template: Template
    size: int


def _build(phrases: tuple[tuple[int, ...], ...]) -> _Tables:
    always = tuple(sorted({p[0] for p in phrases if len(p) == 1}))
    after: dict[tuple[int, ...], set[int]] = {}
    for phrase in phrases:
        if len(phrase) > 1:
            after.setdefault(tuple(phrase[:-1]), set()).add(phrase[-1])
    built: dict[int, list] = {}
    for prefix, last in after.items():
        level, node = built, None
        for token in reversed(prefix):
            node = level.get(token)
            if node is None:
                node = level[token] = [(), {}]
            level = node[1]
        assert node is not None
        node[0] = tuple(sorted(last))
    nodes: list[tuple] = []
    tails = _frozen(built, nodes)
    template: Template
    if after:
        entries = [((), t) for t in always] + [(prefix, t) for prefix, last in after.items() for t in sorted(last)]
        template = BannedPhrasesTemplate(always, tuple(p for p, _ in entries), tuple(t for _, t in entries), tails)
        size = shallow_size((template.prefixes, template.bans)) + shallow_size(after)  # its keys: the prefixes
    else:
        template, size = BannedTokensTemplate(always), 0
    tables = _Tables(always, tails, template, 0)
    size += shallow_size((tables, tails, always, template)) + shallow_size(nodes)
    size += shallow_size(node[1] for node in nodes if type(node[1]) is dict)  # the levels of several tokens
    size += shallow_size(node[0] for node in nodes if node[0]) + INT_BYTES  # the nodes' bans; the size itself
    return tables._replace(size=size)


def _frozen(level: dict[int, list], nodes: list[tuple]) -> dict[int, tuple]:
    """``_build``'s trie level with its nodes frozen (``_node``)."""
    return {token: _node(bans, children, nodes) for token, (bans, children) in level.items()}


def _node(bans: tuple[int, ...], children: dict[int, list], nodes: list[tuple]) -> tuple:
    """A frozen trie node ``(bans, link, child)`` (appended to ``nodes``, for the size count): the
    last tokens the prefix ending here bans, then what may come before it: nothing (``None``,
    ``None``), one token and its node (most nodes past the first level: no dict to look up), or
    the dict of several tokens' nodes (``child`` ``None``)."""
    if not children:
        node: tuple = (bans, None, None)
    elif len(children) == 1:
        ((token, (inner, deeper)),) = children.items()
        node = (bans, token, _node(inner, deeper, nodes))
    else:
        node = (bans, _frozen(children, nodes), None)
    nodes.append(node)
    return node


#: ``_Tables`` per phrase set (validated entries hold tuples of tuples: hashable as they are)
_TABLES: Kept[_Tables] = Kept(TABLES_KEPT, TABLES_BYTES)


def _weight(phrases: tuple[tuple[int, ...], ...], tables: _Tables) -> int:
    """The bytes a phrase set and its tables hold: ``deep_size(phrases)`` and the tables' own
    (``_Tables.size``; their ids are the phrases')."""
    return deep_size(phrases) + tables.size


def _tables(phrases: tuple[tuple[int, ...], ...]) -> _Tables:
    return _TABLES.made(phrases, lambda: _build(phrases), lambda tables: _weight(phrases, tables))


class BannedPhrasesProcessor:
    """Every step, the last token of each phrase whose other tokens end the output is masked; a
    one-token phrase always."""

    __slots__ = ("_always", "_tails", "_sets", "template")

    def __init__(self, phrases: Sequence[Sequence[int]]) -> None:
        try:
            tables = _tables(phrases)  # type: ignore[arg-type]  # tuples as given; lists raise TypeError below
        except TypeError:  # lists: made hashable
            tables = _tables(tuple(tuple(p) for p in phrases))
        self._always, self._tails, self.template, _ = tables
        self._sets: dict[tuple[int, ...], IndexCache] = {}

    @property
    def tails(self) -> dict[int, tuple]:
        """Its phrases' prefixes as a trie read backwards (shared, read only: ``masked_after``)."""
        return self._tails

    def after(self, input_ids: Sequence[int]) -> list[int]:
        """The ids this step masks beyond the one-token phrases (repeats possible, unsorted)."""
        found: list[int] = []
        masked_after(([0], [0], [0], [self._tails]), (input_ids,), found, _reraise)
        return found

    def banned(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks (sorted, no repeats)."""
        extra = self.after(input_ids)
        return tuple(sorted({*self._always, *extra})) if extra else self._always

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        ids = self.banned(input_ids)
        if not ids:
            return None
        index = self._sets.get(ids)
        if index is None:
            if len(self._sets) >= KEPT_SETS:
                self._sets.clear()
            index = self._sets[ids] = IndexCache(ids)
        return MaskIds(index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def _walk_each(walks: Iterable[tuple[int, int, int, dict[int, tuple]]], histories: Sequence[Sequence[int]],
               found: list[int], fail: Callable[[int, int, Exception], None]) -> None:
    """``masked_after`` row by row, for each ``(offset, row, slot, tails)``; a row whose walk raises
    is passed to ``fail(row, slot, exc)`` and masks nothing."""
    for offset, row, slot, tails in walks:
        try:
            history = histories[row]
            i = len(history) - 1
            if i < 0 or (node := tails.get(history[i])) is None:
                continue
            ids = _walk_back(node, history, i)
        except Exception as exc:  # a bug must not escape the sampler: this row alone
            fail(row, slot, exc)
            continue
        for t in ids:
            found.append(offset + t)


def _walk_back(node: tuple, history: Sequence[int], i: int, first: int = 0) -> tuple[int, ...]:
    """The ids banned after ``history[first:i + 1]`` from ``node``, the trie's node of ``history[i]``:
    its bans, then each deeper node's that the tokens before it reach (at most the longest prefix)."""
    ids, link, child = node
    while link is not None and i > first:
        i -= 1
        token = history[i]
        if token != link:  # a node's one token before it, else a dict of several (or a mismatch)
            if type(link) is not dict or (child := link.get(token)) is None:
                break
        ids += child[0]
        _, link, child = child
    return ids


#: a history's last token (a C call per row in ``masked_after``'s maps)
_LAST = itemgetter(-1)


#: ``masked_after``'s rows: their offsets, rows (in ``histories``), slots and tries (``tails``)
Walks: TypeAlias = tuple[list[int], list[int], list[int], list[dict[int, tuple]]]


def masked_after(walks: Walks, histories: Sequence[Sequence[int]], found: list[int],
                 fail: Callable[[int, int, Exception], None]) -> None:
    """For each row ``k`` of ``walks`` (``offsets, rows, slots, tries``): appends ``offsets[k] + id``
    to ``found`` for every id the row masks after ``histories[rows[k]]`` beyond its one-token phrases
    (repeats possible), found by a walk back from the last token over ``tries[k]``
    (``BannedPhrasesProcessor.tails``), at most as many steps as the longest prefix. A row whose walk
    raises is passed to ``fail(rows[k], slots[k], exc)`` and masks nothing.

    No call per row (the V1 runner's host work per step, run cache-cold after the forward pass):
    every row's last token is looked up in its trie by two C-level ``map`` passes (no bytecode per
    row, so the rows' cache misses overlap), then only the rows that hit are walked further. A
    history that is empty or breaks that lookup (an unhashable token) sends the step row by row
    (``_walk_each``), which fails such a row alone."""
    offsets, rows, slots, tries = walks
    try:
        held = list(map(histories.__getitem__, rows))
        nodes = list(map(dict.get, tries, map(_LAST, held)))
    except Exception:  # an empty history or an odd token: row by row, a failure per row
        _walk_each(zip(offsets, rows, slots, tries), histories, found, fail)
        return
    for k, node in enumerate(nodes):
        if node is None:
            continue
        try:
            history = held[k]
            ids = _walk_back(node, history, len(history) - 1)
        except Exception as exc:  # a bug must not escape the sampler: this row alone
            fail(rows[k], slots[k], exc)
            continue
        offset = offsets[k]
        for t in ids:
            found.append(offset + t)


def _reraise(row: int, slot: int, exc: Exception) -> None:
    raise exc


class _OutOfPhase(tuple):
    """The empty history of a member row out of a scoped entry's phase (``neutral_history``): one
    object, told apart from an empty stretch by identity."""

    __slots__ = ()


#: ``BannedPhrasesGroup.neutral_history``: masks nothing, not even the one-token phrases
_OUT_OF_PHASE = _OutOfPhase()


#: what ``decide_from_window`` returns on the CPU route: the walk is deferred to
#: ``apply_device_decisions``, which has the logits' stride (never read, never written)
_CPU_STEP = torch.empty(0, dtype=torch.bool)
#: what ``decide_from_window`` returns where the fused op runs: the step is ``apply_device_decisions``'
_FUSED_STEP = torch.empty(0, dtype=torch.bool)

#: ``memoryview`` formats of the token dtypes the CPU route reads (``_apply_on_cpu``)
_CODES = {torch.int32: "i", torch.int64: "q", torch.int16: "h", torch.uint8: "B", torch.int8: "b"}

#: dtypes of host logits that ``BannedPhrasesGroup`` writes through numpy (``_write_host``)
_NUMPY_FLOATS = frozenset({torch.float32, torch.float16, torch.float64})

#: token dtypes whose values never equal ``BannedPhrasesGroup.UNMATCHED``
_NARROW = (torch.int32, torch.int16, torch.uint8, torch.int8)


def _tokens_at(window: TokenWindow, at: torch.Tensor) -> torch.Tensor:
    """The tokens of ``window.tokens`` at flat indices ``at`` (one ``take``): the window-decided
    step's only read of the rows' tokens without drafts (``BannedPhrasesGroup.decide_from_window``)."""
    return torch.take(window.tokens, at)


class _RowTables(NamedTuple):
    """A window-decided step's tables, per row of the layout (``BannedPhrasesGroup._rows_tables``)."""

    slots: torch.Tensor
    prefix: torch.Tensor
    unused: torch.Tensor
    bans: torch.Tensor
    ready: torch.Tensor
    #: ``[rows, width + 1]``: added to ``pos`` once a step, the flat indices in ``tokens`` of each
    #: row's last ``width`` tokens and, last, its output's length (``pos - prompt_len + 1``)
    shift: torch.Tensor
    #: ``[rows, entries]``: each entry's prefix length, ``NEVER`` for rows outside the group
    need: torch.Tensor
    #: ``[rows, width, entries]``: ``prefix`` widened and transposed (a reduction over the middle
    #: dimension runs ~2x faster on the CPU than over a last one of 2-8), unused cells ``UNMATCHED``
    cells: torch.Tensor
    #: ``tokens.shape[1]`` the flat indices were made for
    stride: int


class _CpuWalks(NamedTuple):
    """The window-decided step's CPU route tables, per layout (``BannedPhrasesGroup._cpu_walks``)."""

    #: the member rows (indices into the step's rows), their slots and tries
    at: list[int]
    slots: list[int]
    tries: list[dict[int, tuple]]
    #: each member's token row's start in the window's flat tokens, and ``1 - prompt_len``
    starts: list[int]
    leads: list[int]
    #: whether the members are every row of the step, in order (``at == range(rows)``)
    every: bool
    #: per logits row stride (made at first use): the one-token phrases' flat indices (host, device)
    #: and the members' rows' offsets
    per_stride: dict[int, tuple[np.ndarray, torch.Tensor, list[int]]]


class BannedPhrasesGroup(EntryTablesGroup):
    """``banned_phrases`` with phrases of several tokens, decided per row from its last tokens.

    With host histories (``SlotBatch(host_histories=True)``): from each row's own trie, every row in
    one pass (``decide_rows``, ``masked_after``); every step one ``index_fill_`` of the rows'
    one-token phrases (indices uploaded once per batch change), or, on a step that finds ids, one
    upload of those and the found ones and one ``index_fill_`` of them instead (host logits of a
    numpy dtype: the same indices written by one numpy assignment, ``_write_host``). With a
    ``TokenWindow`` instead (``decide_from_window``): every row's entries
    (each phrase as its prefix, right-aligned in ``width`` columns, unused ones ``-1``, and the id it
    bans) are compared with the row's last ``width`` tokens on the device, and the ids of the entries
    that match are masked with one ``scatter_reduce_`` (``amin`` with ``+inf`` elsewhere: repeats
    and non-members leave logits as they are), or all that in one fused op where ``GATE`` is ready
    (``dynlogits.kernels.banned_phrases``: the tables read as they are, no per-layout gather); on
    the CPU without drafts, the rows' last tokens are read from the window's memory and walked
    over their tries instead, as with host histories (``_apply_on_cpu``). The tables: ``EntryTablesGroup`` (e.g. 256 phrases
    of 17 tokens fill its 4096 cells). Masks only: never leaves a row empty by itself."""

    #: ``need`` of the padding entries of a slot with fewer entries than the table: never matches
    NEVER = _NEVER
    #: an unused prefix cell, widened: below every int32 token, however arbitrary (``decide_from_window``)
    UNMATCHED = -(1 << 40)
    #: a member row out of a scoped entry's phase (``scope.ScopedDecided``): nothing masked
    neutral_history = _OUT_OF_PHASE

    @classmethod
    def scopable(cls, template: Template) -> bool:
        """A scoped entry is resident with host histories (``scope.ScopedDecided``): a row decides from
        any history (its stretch: a phrase matches only inside it), and a row out of its phase is
        decided from ``neutral_history``, which masks nothing (its one-token phrases neither:
        ``_decide_scoped``)."""
        return True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self._always: dict[int, tuple[int, ...]] = {}  # slot -> its one-token phrases
        self._layout = StepUpload(torch.long, device)  # the one-token phrases' flat indices, per layout
        self._extremes: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self._on_host = not on_accelerator(device)  # host logits: written through numpy (``_write_host``)

    def _new_tables(self) -> tuple[SlotTable, ...]:
        self.prefix = self.table(torch.int32, width=max(1, self.entries * self.width))  # [slots, entries * width]
        self.bans = self.table(torch.long, width=max(1, self.entries))  # the id each entry masks (a scatter index)
        self.need = self.table(torch.long, width=max(1, self.entries))  # its prefix length (``NEVER``: padding)
        return self.prefix, self.bans, self.need

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:  # a released slot keeps no one-token phrases
            self._always.pop(slot, None)
        super().assign(slot, template)

    def _write(self, slot: int, template: BannedPhrasesTemplate) -> None:
        self._always[slot] = template.always
        super()._write(slot, template)

    def _write_entries(self, slot: int, template: BannedPhrasesTemplate) -> None:
        w, pad = self.width, self.entries - len(template.bans)
        prefix: list[int] = []
        for p in template.prefixes:
            prefix += [-1] * (w - len(p)) + list(p)
        self.prefix.set(slot, prefix + [-1] * (w * pad))
        self.bans.set(slot, list(template.bans) + [template.bans[0]] * pad)
        self.need.set(slot, [len(p) for p in template.prefixes] + [self.NEVER] * pad)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: each row's start in the flat logits (host) and its one-token phrases' flat
        indices, uploaded once (``None``: no row has one)."""
        super().prepare(rows, stride)
        base = (rows.rows * stride).tolist()
        self._cache["base"] = base
        if self.scoped:  # each row's one-token phrases, masked in its phase only (``_decide_scoped``)
            self._cache["always"] = [[b + t for t in self._always[slot]] for b, slot in zip(base, rows.slots.tolist())]
        fixed = [] if self.scoped else [b + t for b, slot in zip(base, rows.slots.tolist()) for t in self._always[slot]]
        if fixed:
            self._layout.buffer(len(fixed))[:] = fixed
        self._cache["fixed"] = self._layout.upload(len(fixed), keep=True) if fixed else None
        self._cache["fixed_host"] = np.asarray(fixed, dtype=np.int64)  # copied ahead of a step's found ids

    def decide_rows(self, deciders: list[tuple[int, int, Any]], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> list[int]:
        """The flat indices the member rows mask this step beyond their one-token phrases, in one
        ``masked_after`` pass (each row's offset, row, slot and trie kept per layout as four lists).
        The inner group of a scoped entry: ``_decide_scoped``."""
        if self.scoped:
            return self._decide_scoped(deciders, histories, fail)
        walks = self._cache.get("walks")
        if walks is None:  # four lists, zipped each step: their items lie side by side
            walks = self._cache["walks"] = (self._cache["base"], [row for row, _, _ in deciders],
                                            [slot for _, slot, _ in deciders], [p.tails for _, _, p in deciders])
        found: list[int] = []
        masked_after(walks, histories, found, fail)
        return found

    def _decide_scoped(self, deciders: list[tuple[int, int, Any]], histories: Sequence[Sequence[int]],
                       fail: Callable[[int, int, Exception], None]) -> list[int]:
        """``decide_rows`` of a scoped entry's inner group: the rows whose history is not
        ``neutral_history`` (in the entry's phase, each history its stretch) mask their one-token
        phrases and what their walk finds; the others nothing."""
        base, always = self._cache["base"], self._cache["always"]
        neutral = self.neutral_history
        found: list[int] = []
        offsets: list[int] = []
        rows: list[int] = []
        slots: list[int] = []
        tries: list[dict[int, tuple]] = []
        for k, (row, slot, processor) in enumerate(deciders):
            if histories[row] is neutral:
                continue
            found += always[k]
            offsets.append(base[k])
            rows.append(row)
            slots.append(slot)
            tries.append(processor.tails)
        masked_after((offsets, rows, slots, tries), histories, found, fail)
        return found

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, found: list[int], upload: StepUpload) -> None:
        """One ``index_fill_``: of the one-token phrases' indices (uploaded per layout) on a step that
        finds no id, else of those and ``found`` in one upload (a copy of the layout's indices ahead
        of the found ones: one masked write, not two). Host logits of a numpy dtype: the same indices
        set to ``-inf`` by one numpy assignment instead, no torch op (``_write_host``)."""
        if self._on_host and step.flat.dtype in _NUMPY_FLOATS:
            return self._write_host(step, self._cache["fixed_host"], found, upload)
        if not found:
            fixed: torch.Tensor | None = self._cache["fixed"]
            if fixed is not None:
                step.flat.index_fill_(0, fixed, NEG_INF)
            return None
        host: np.ndarray = self._cache["fixed_host"]
        k = len(host)
        buffer = upload.buffer(k + len(found))
        buffer[:k] = host
        buffer[k:] = found
        step.flat.index_fill_(0, upload.upload(k + len(found)), NEG_INF)
        return None

    def _tokens_view(self, tokens: torch.Tensor) -> memoryview:
        """The memory of ``tokens`` (on the host, contiguous, a ``_CODES`` dtype) as a flat memoryview
        of its dtype, kept while ``tokens`` is the same tensor at the same address: the engine's
        token buffer, viewed once, not every step (the view holds the tensor, so no other one
        takes that address while it is kept)."""
        address = tokens.data_ptr()
        kept = self._cache.get("tokens_view")
        if kept is not None and kept[0] is tokens and kept[1] == address:
            return kept[2]
        view = memoryview(tokens.numpy()).cast("B").cast(_CODES[tokens.dtype])  # type: ignore[arg-type, call-overload]
        self._cache["tokens_view"] = (tokens, address, view)
        return view

    def _write_host(self, step: StepInputs, fixed: np.ndarray, found: list[int], scratch: StepUpload) -> None:
        """``-inf`` at the flat indices ``fixed`` (host, kept per layout) and ``found`` of host logits
        of a numpy dtype (``_NUMPY_FLOATS``), by one numpy assignment through the logits' memory,
        ``found`` copied after ``fixed`` into ``scratch``'s buffer (on the host nothing is uploaded):
        no torch op (a step runs cache-cold: each torch or numpy call costs microseconds)."""
        index = fixed
        if found:
            k = len(fixed)
            index = scratch.buffer(k + len(found))
            index[:k] = fixed
            index[k:] = found
        elif not len(index):
            return None
        step.flat.numpy()[index] = NEG_INF
        return None

    def _write_ids(self, step: StepInputs, fixed_host: np.ndarray, fixed: torch.Tensor, found: list[int]) -> None:
        """``_apply_on_cpu``'s writes: ``-inf`` at the flat indices ``fixed`` (the same on the host:
        ``fixed_host``) and ``found``: ``_write_host`` where it applies, else an ``index_fill_`` of each."""
        if self._on_host and step.flat.dtype in _NUMPY_FLOATS:
            return self._write_host(step, fixed_host, found, self._layout)
        if len(fixed):
            step.flat.index_fill_(0, fixed, NEG_INF)
        if found:
            step.flat.index_fill_(0, torch.tensor(found, dtype=torch.long), NEG_INF)
        return None

    def _rows_tables(self, rows: GatheredRows, window: TokenWindow) -> _RowTables:
        """The tables of the rows' slots, gathered once while ``rows.slot_of_row`` is the same tensor
        (a listed layout), ``window.tokens`` as wide and no table changes (a flush clears ``_cache``):
        the slots within the engine's, each entry's prefix ``[rows, entries, width]`` and its unused
        columns, the id it bans ``[rows, entries]``, the last position its prefix can end before it
        may match (``need + prompt_len - 1``; ``NEVER`` for rows outside the group), and what a step
        adds to ``pos`` (``_RowTables.shift``) and compares with (``_RowTables.need``)."""
        stride = window.tokens.shape[1]
        cached = self._cache.get("window")
        if cached is not None and cached[0] is rows.slot_of_row and cached[1].stride == stride:
            return cached[1]
        r, e, w = len(rows.slot_of_row), self.entries, self.width
        slots = window.slots(rows.slot_of_row)
        prefix = self.prefix.dev[rows.slot_of_row].view(r, e, w)
        need = torch.where(rows.member[:, None], self.need.dev[rows.slot_of_row], self.NEVER)
        prompt_len = window.prompt_len[slots].long()
        ready = need + prompt_len[:, None] - 1
        columns = torch.arange(1 - w, 1, device=slots.device)
        shift = torch.cat(((slots.long() * stride)[:, None] + columns[None, :], 1 - prompt_len[:, None]), dim=1)
        unused = prefix < 0
        cells = torch.where(unused, self.UNMATCHED, prefix.long()).transpose(1, 2).contiguous()
        made = _RowTables(slots, prefix, unused, self.bans.dev[rows.slot_of_row], ready, shift, need, cells, stride)
        self._cache["window"] = (rows.slot_of_row, made)
        return made

    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Per row and entry (``[rows, entries]``): whether the row's output ends with the entry's
        prefix, so its id is masked now; or a marker, the step deferred to ``apply_device_decisions``
        (which has the logits): ``_FUSED_STEP`` where the fused op runs (``GATE.ready``: CUDA once
        probed, the CUDA model), ``_CPU_STEP`` on the CPU route below. Otherwise ``_decide_eager``.

        On the CPU without drafts (a contiguous window of integer tokens, every member's template
        with its trie) nothing is computed here: ``_CPU_STEP`` is returned and
        ``apply_device_decisions`` walks the rows (``_apply_on_cpu``)."""
        return self._decide(rows, window, None)

    def _decide(self, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor | None) -> torch.Tensor:
        """``decide_from_window``, each row's prefixes counted from ``floor[r]`` on where given
        (``apply_floored``): then on the CPU the fused op's CPU implementation (exact, as the hosted
        path), not the walk."""
        on_cpu = window.tokens.is_cpu and window.pos.is_cpu  # (cheaper than device.type, read cold)
        if (floor is None and window.input_ids is None and on_cpu and window.tokens.dtype in _CODES
                and window.tokens.is_contiguous()):
            walks = self._cpu_walks(rows, self._rows_tables(rows, window))
            if walks is not None:
                self._cache["cpu_step"] = (walks, window)
                return _CPU_STEP
        if GATE.ready(window.pos.device) or (floor is not None and on_cpu):
            self._cache["fused_step"] = (window, floor)
            return _FUSED_STEP
        return self._decide_eager(rows, window, floor)

    def _decide_eager(self, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor | None = None) -> torch.Tensor:
        """``decide_from_window``'s decisions in eager device ops (the fallback of the fused op).

        Without drafts and with int32 tokens (vLLM's), six device ops: ``pos`` plus the layout's
        constants gives each row's last ``width`` tokens' flat indices and its output's length ``L``
        at once; an entry matches when ``min(count, L) == need``, ``count`` its prefix's cells equal to
        the row's tokens (an unused cell, ``UNMATCHED``, equals no int32 value, even a column read
        before the row's start): ``count == need`` (the whole prefix) and ``need <= L`` (it lies in
        the output). Otherwise (drafts: ``window.input_ids``; wider tokens) the tokens come from
        ``window.tail`` and an unused cell matches whatever the row holds (a placeholder draft is ``-1``).
        A ``floor`` (per row, int64) bounds ``L`` by ``pos - floor + 1`` (three ops more): a prefix lies
        in the stretch."""
        t = self._rows_tables(rows, window)
        if window.input_ids is None and window.tokens.dtype in _NARROW:
            w = self.width
            at = window.pos[:, None] + t.shift  # [rows, width + 1]
            tail = _tokens_at(window, at[:, :w])  # a column before the row's start: arbitrary, L rules it out
            count = (t.cells == tail[:, :, None]).sum(1)
            length = at[:, w:] if floor is None else torch.minimum(at[:, w:], (window.pos + 1 - floor)[:, None])
            return torch.minimum(count, length) == t.need
        tail = window.tail(t.slots, self.width)
        hit = ((t.prefix == tail[:, None, :]) | t.unused).all(2) & (t.ready <= window.pos[:, None])
        return hit if floor is None else hit & (t.need <= (window.pos + 1 - floor)[:, None])

    def _cpu_walks(self, rows: GatheredRows, t: _RowTables) -> _CpuWalks | None:
        """The CPU route's tables, per layout (with ``_rows_tables``'): the member rows, their
        slots, tries and token rows' starts in the window, ``1 - prompt_len``; ``None`` where a
        member's template has no trie."""
        cached = self._cache.get("cpu_walks")
        if cached is not None and cached[0] is t:
            return cached[1]
        at = [k for k, m in enumerate(rows.member.tolist()) if m]
        slot_of_row = rows.slot_of_row.tolist()
        slots = [slot_of_row[k] for k in at]
        tries = [self._templates[slot].tails for slot in slots]  # the members' (``EntryTablesGroup``)
        shift = t.shift.tolist()  # column width - 1: slot * stride; column width: 1 - prompt_len
        made = None if None in tries else _CpuWalks(at, slots, tries, [shift[k][-2] for k in at],
                                                    [shift[k][-1] for k in at], at == list(range(len(shift))), {})
        self._cache["cpu_walks"] = (t, made)
        return made

    def _apply_on_cpu(self, step: StepInputs) -> None:
        """The window-decided step on the CPU (``decide_from_window`` deferred it here), in Python
        over the window's memory (a step runs cache-cold: each torch or numpy call costs
        microseconds then): every member row's last token read and looked up in its trie by C-level
        maps, then only the rows that hit walked back over their last ``width`` output tokens (a
        view of the window: what the hosted processor masks, exactly, since no prefix is longer
        than ``width``); the one-token phrases (their indices kept per layout and row stride) and
        the found ids masked together (``_write_ids``)."""
        walks, window = self._cache.pop("cpu_step")
        kept = walks.per_stride.get(step.stride)
        if kept is None:
            fixed = [k * step.stride + t for k, slot in zip(walks.at, walks.slots) for t in self._always[slot]]
            kept = walks.per_stride[step.stride] = (np.asarray(fixed, dtype=np.int64), torch.tensor(fixed, dtype=torch.long),
                                                    [k * step.stride for k in walks.at])
        fixed_host, fixed, offsets = kept
        tokens = self._tokens_view(window.tokens)
        pos = window.pos.tolist()
        if not walks.every:
            pos = list(map(pos.__getitem__, walks.at))
        ends = list(map(add, walks.starts, pos))  # each member's last token in the flat window
        nodes = list(map(dict.get, walks.tries, map(tokens.__getitem__, ends)))
        found: list[int] = []
        w, leads = self.width, walks.leads
        for k in compress(range(len(nodes)), nodes):
            n = min(pos[k] + leads[k], w)  # the output's last tokens, at most ``width``
            if n > 0:  # else the row has no output yet: its last token is the prompt's
                end = ends[k]
                offset = offsets[k]
                for t in _walk_back(nodes[k], tokens, end, end - n + 1):  # type: ignore[arg-type]  # a hit: not None
                    found.append(offset + t)
        self._write_ids(step, fixed_host, fixed, found)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, hit: torch.Tensor) -> None:
        """``-inf`` at the ids of the entries ``decide_from_window`` found: where it deferred the step
        to the fused op, ``banned_phrases_ban_`` (one launch; on CUDA a variant not compiled yet compiles
        off the step, the eager ops answering until it lands, and one failing to compile turns it
        off with one warning: ``FusedGate.run``); on the CPU
        route, found here; else one ``scatter_reduce_`` (``_write_eager``)."""
        if hit is _CPU_STEP:
            self._apply_on_cpu(step)
        elif hit is _FUSED_STEP:
            window, floor = self._cache.pop("fused_step")
            drafts = window.input_ids is not None and window.local_pos is not None
            args = (step.logits, window.tokens, window.prompt_len, window.pos, rows.slot_of_row, rows.member,
                    self.prefix.dev, self.bans.dev, self.need.dev, window.input_ids if drafts else None,
                    window.local_pos if drafts else None, floor, self.entries, self.width)
            if step.logits.device.type == "cpu":  # a floored step on the CPU: the op's CPU implementation
                banned_phrases_ban_(*args)
            else:  # on CUDA a new variant (BLOCK_W, drafts, floor, dtypes) compiles off the step, eager until it lands
                device = step.logits.device
                GATE.run_named(device, lambda: banned_phrases_ban_(*args),
                               lambda: self._write_eager(step, self._decide_eager(rows, window, floor)),
                               banned_phrases_kernels.variant, *args)
        else:
            self._write_eager(step, hit)
        return None

    #: a scoped entry is resident without host histories (``scope.ScopedDecided``): ``apply_floored``;
    #: its entry tables written only once it decides from the window (never with host histories)
    floored = True
    tables_at_first_window = True

    def apply_floored(self, step: StepInputs, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor) -> None:
        """Every row decided from ``window`` as ``decide_from_window`` and ``apply_device_decisions``
        decide it, no prefix cell below ``floor[r]`` (a row out of its phase: ``NEVER``, nothing, its
        one-token phrases neither): on CUDA the one fused op with the floor (or its eager fallback),
        on the CPU the op's CPU implementation."""
        return self.apply_device_decisions(step, rows, self._decide(rows, window, floor))

    def _write_eager(self, step: StepInputs, hit: torch.Tensor) -> None:
        """``-inf`` at the ids of the entries ``hit`` found (``_decide_eager``'s): one ``where`` and one
        ``scatter_reduce_`` (``amin`` with ``+inf`` elsewhere: repeats and non-members leave logits
        as they are; a NaN logit stays NaN where banned, unlike the fused op and the host path)."""
        bans = self._cache["window"][1].bans  # this step's, from _decide_eager
        key = (step.logits.dtype, step.logits.device)
        extremes = self._extremes.get(key)
        if extremes is None:
            extremes = self._extremes[key] = (torch.full((), NEG_INF, dtype=key[0], device=key[1]),  # fills, no copy
                                              torch.full((), -NEG_INF, dtype=key[0], device=key[1]))
        step.logits.scatter_reduce_(1, bans, torch.where(hit, *extremes), reduce="amin")


@dataclass(frozen=True, slots=True)
class BannedPhrasesTemplate(Template):
    """Every step: ``row[always] = -inf``, and the last tokens of the phrases whose other tokens end
    the output (decided per row). ``prefixes[i]`` and ``bans[i]``: entry ``i`` masks ``bans[i]``
    when the output ends with ``prefixes[i]`` (the one-token phrases first, with empty prefixes)."""

    always: tuple[int, ...]
    prefixes: tuple[tuple[int, ...], ...] = ()
    bans: tuple[int, ...] = ()
    #: the same entries as the processors' trie (``BannedPhrasesProcessor.tails``; shared, read
    #: only), for the window-decided step's CPU route; ``None``: that route is off for its rows
    tails: dict[int, tuple] | None = field(default=None, compare=False, repr=False)

    @property
    def geometry(self) -> tuple[int, int]:
        """Its entries and the longest prefix: the device table cells it needs per slot."""
        return len(self.bans), max(len(p) for p in self.prefixes)
    group: ClassVar[type[BannedPhrasesGroup]] = BannedPhrasesGroup
    reads_tokens: ClassVar[bool] = True


def factory(entry: Entry, ctx: RealizeContext) -> BannedPhrasesProcessor:
    """A fresh processor for one ``banned_phrases`` entry (resolved: ``phrases`` only)."""
    return BannedPhrasesProcessor(entry.phrases)
