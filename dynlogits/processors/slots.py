"""What every kind's resident group shares: per-slot device tables, the two row layouts, one step's
inputs, the rows a group may leave empty (``Dead``), and the ``Group`` base a kind implements.

Entry ``k`` of every resident request of one kind forms a group (``level`` ``k``) of
``dynlogits.sdk.resident.SlotBatch``; a kind names its ``Group`` subclass on its template
(``Template.group``), which is all the slot engine knows of it, with the group's mode
(``dynlogits.processors.modes``). Layouts:

* listed (``ListedRows``; the host knows each row's slot: vLLM V1, Model Runner V2 without drafts):
  rows and flat indices built once per batch change (``prepare``); a step is ``index_fill_`` /
  ``index_add_`` / ``index_copy_`` plus a memset per run of consecutive rows;
* gathered (``GatheredRows``; only the device knows: V2 with drafts): every row gathers its slot's
  table, and a membership mask makes non-member writes no-ops.

Semantics are ``dynlogits.processors.ops``'. Padded table cells repeat one of the row's own ids
(bias values pad with 0.0), so they never touch another id."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import numpy as np
import torch

from .ops import fill_rows, row_runs
from .uploads import StepUpload, on_accelerator, pinned

__all__ = [
    "Dead",
    "GatheredRows",
    "Group",
    "IdsGroup",
    "ListedRows",
    "SlotTable",
    "StepInputs",
    "Template",
    "flat_indices",
    "force_decided_rows",
    "force_device_decisions",
    "force_gathered",
    "force_listed",
    "force_listed_at",
    "listed_positions",
    "mask_gathered",
]

NEG_INF = -math.inf


class Template:
    """What a built-in processor does at *every* step, as data (plain tuples: no torch, no state),
    so the slot engine can keep it on the device: each kind's template is a frozen dataclass
    subclassing this, naming the ``Group`` that runs it."""

    __slots__ = ()
    #: the group type that runs this kind on the resident path
    group: ClassVar[type[Group]]
    #: whether the kind reads the tokens themselves, not only their count (the V1 runner then
    #: checks histories for async scheduling's placeholder)
    reads_tokens: ClassVar[bool] = False
    #: for a kind decided from a span it follows (``modes.SpanDecided``), the
    #: ``device_thinking.SpanTables`` type the device decider (``DeviceThinking``) keeps for it where
    #: histories live on the device; else ``None``
    device_spans: ClassVar[type | None] = None


class SlotTable:
    """A ``[num_slots, width]`` device table with a host mirror; rows grow to the widest value set.

    ``set(slot, values)`` writes a host row, padded with ``pad`` or (``pad is None``) by repeating
    its last value (an empty row is zeros); ``flush()`` copies the rows set since the last flush.
    ``dev`` is valid after ``flush``; a wider table is a new tensor, so read ``dev`` after each flush."""

    def __init__(self, num_slots: int, dtype: torch.dtype, device: torch.device, *, width: int = 1,
                 pad: float | None = None) -> None:
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.pad = pad
        self._dirty: set[int] = set()
        self._event: Any = None  # torch.cuda.Event of the last queued copies
        self._whole = False  # the device table is new (wider): copy the whole mirror at flush
        self.host: torch.Tensor | None = None
        self._alloc(width)

    def _alloc(self, width: int) -> None:
        host = pinned((self.num_slots, width), self.dtype, self.device)
        old = self.host
        if old is not None:
            host[:, : old.shape[1]] = old
            host[:, old.shape[1] :] = old[:, -1:] if self.pad is None else self.pad
        elif self.pad is not None:
            host.fill_(self.pad)
        self.host = host
        self.host_np = host.numpy()
        self.width = width
        if on_accelerator(self.device):  # the whole mirror goes at the next flush, without blocking
            self.dev = torch.empty(host.shape, dtype=self.dtype, device=self.device)
            self._whole = True
        else:
            self.dev = host

    def set(self, slot: int, values: Sequence[float] | np.ndarray) -> None:
        n = len(values)
        self._own_mirror()
        if n > self.width:
            self._alloc(max(n, 2 * self.width))
        row = self.host_np[slot]
        row[:n] = values
        row[n:] = (row[n - 1] if n else 0) if self.pad is None else self.pad
        self._dirty.add(slot)

    def _own_mirror(self) -> None:
        """Make the mirror writable without waiting: while the last flush's copies still read it
        (a batch change, or a failure noted, before the device ran them), write to a fresh pinned
        copy instead; the caching host allocator keeps the old one until those copies have run."""
        if self._event is not None and not self._event.query():
            old = self.host
            assert old is not None
            host = pinned(tuple(old.shape), self.dtype, self.device)
            host.copy_(old)
            self.host, self.host_np = host, host.numpy()
        self._event = None

    def flush(self) -> bool:
        """Copy the rows set since the last flush to the device; whether there were any."""
        if not self._dirty and not self._whole:
            return False
        if on_accelerator(self.device):
            host = self.host
            assert host is not None  # allocated in __init__
            if self._whole:
                self.dev.copy_(host, non_blocking=True)
            else:
                for slot in sorted(self._dirty):
                    self.dev[slot].copy_(host[slot], non_blocking=True)
            self._record()
        self._dirty.clear()
        self._whole = False
        return True

    def _record(self) -> None:
        self._event = torch.cuda.Event()
        self._event.record()


@dataclass
class ListedRows:
    """A group's member rows in this batch layout (host-known): row indices and their slots on the
    host and the device, and the rows as ``[start, stop)`` runs."""

    rows: np.ndarray
    slots: np.ndarray
    rows_dev: torch.Tensor
    slots_dev: torch.Tensor
    runs: list[tuple[int, int]]
    #: flat index of each row's stop token (column 0 for a request without one) and whether it has
    #: one (``None``: every row has one)
    stop_index: torch.Tensor | None = None
    can_stop: torch.Tensor | None = None
    #: ``rows_dev * stride``: where each row starts in the flat logits
    base: torch.Tensor | None = None
    #: whether the member rows are exactly ``0..n-1`` in order (row-indexed values need no gather)
    identity: bool = False
    #: whether no later group of the step can mask these rows (a restrictive group may then settle
    #: its empty rows itself: ``Dead.settled``)
    last: bool = False
    #: this step's values the host planned for the group (``modes.PlannedGroup.plan``), on the device, one row
    #: per value (``[planned_per_row, n]``); ``None`` when the host does not know the positions this
    #: step (set by ``SlotBatch`` every step)
    planned: torch.Tensor | None = None
    #: a decided group's ``(row, slot, processor)`` per member row (``modes.DecidedGroup.decide_rows``),
    #: kept for the layout's lifetime (``dynlogits.sdk.resident.deciding``; a new layout builds new
    #: ``ListedRows``)
    deciders: list[tuple[int, int, Any]] | None = None


@dataclass
class GatheredRows:
    """Every row of the step with its slot and whether it belongs to the group (device-only)."""

    slot_of_row: torch.Tensor
    member: torch.Tensor
    #: whether no later group of the step can mask these rows (set by the gathered layout)
    last: bool = False


@dataclass(slots=True)
class StepInputs:
    """What one step gives every group: the logits (and their flat view), the number of tokens
    each row's request has generated (row-indexed, ``None`` when no group needs positions), and
    each slot's stop token (``-1``: none)."""

    logits: torch.Tensor
    flat: torch.Tensor
    stride: int
    generated: torch.Tensor | None
    stops: torch.Tensor
    #: where a group that settles its empty rows reports them itself: ``flag_rows(rows, positions)``,
    #: ``rows`` an int64 device tensor of each row's slot (the tables' last slot: not flagged), with
    #: the host's positions (one per row), or ``[2, n]``: the slots, then the positions (queued back to
    #: the host in this step: ``dynlogits.sdk.resident.failures.Failures.flag_rows``). ``None``: rows
    #: may be drafts, so ``SlotBatch`` decides which rows to flag
    flag_rows: Callable[[torch.Tensor, np.ndarray | None], None] | None = None
    #: under speculative decoding (``flag_rows`` then ``None``): whether each row follows its
    #: request's committed tokens (no draft before it), and ``flag_rows`` for a group that flags those
    #: rows alone (a dead row after a draft only stops: the draft may be rejected)
    real_rows: torch.Tensor | None = None
    flag_real_rows: Callable[[torch.Tensor, np.ndarray | None], None] | None = None
    #: listed layout, positions as the runner holds them (Model Runner V2): ``generated = pos -
    #: pos_offset`` (row-indexed; ``pos_offset`` is the same tensor while the layout stays), for a
    #: group that reads them without the subtraction (``generated`` is then ``None`` unless another
    #: group of the step needs it: ``Group.reads_generated``)
    pos: torch.Tensor | None = None
    pos_offset: torch.Tensor | None = None


@dataclass(slots=True)
class Dead:
    """Rows a restrictive group may leave with no token: slot ``slots[i]``'s row, at output position
    ``positions[i]`` (``None``: unknown), has none when every id of its ``witness`` is ``-inf`` once
    every group has run (tested by ``Failures.record_dead``: ``dynlogits.kernels.dead_rows``).
    Listed: ``rows`` is the rows' device index, ``witness`` flat indices ``[n, w]``
    (``stop_index``/``can_stop`` as in ``ListedRows``). Gathered: ``rows`` is ``None``, ``witness``
    column ids ``[rows, w]``, ``where`` the rows touched. ``witness`` is ``None`` when the group
    settled its rows."""

    rows: torch.Tensor | None
    slots: torch.Tensor
    witness: torch.Tensor | None
    positions: torch.Tensor | None
    stop_index: torch.Tensor | None = None
    can_stop: torch.Tensor | None = None
    where: torch.Tensor | None = None
    #: the empty rows, already fail-stopped by the group (only their flags remain to be written)
    settled: torch.Tensor | None = None
    #: the group reported its empty rows already (``StepInputs.flag_rows``)
    flagged: bool = False


def flat_indices(rows: ListedRows, ids: torch.Tensor, stride: int) -> torch.Tensor:
    """Flat logits indices of each member row's table ids: ``[n * width]``."""
    return (rows.rows_dev[:, None] * stride + ids[rows.slots_dev]).reshape(-1)


#: ``Group.counted_settle``'s step: ``(step, rows, counts, decided, eager)``, ``decided`` the rows'
#: decisions when they are the counts (``None``: every member row at its count), ``eager()`` the
#: step without the settle, run while the settle cannot (a kernel variant compiling off the step).
CountedSettle: TypeAlias = Callable[
    [StepInputs, GatheredRows, torch.Tensor, "torch.Tensor | None", Callable[[], "Dead | None"]], "Dead | None"]


class Group:
    """Entry position ``level`` of one kind, for every slot that has one there: its per-slot device
    tables (``table``), written when a request enters a slot (``_write``), and its step in either
    layout (``apply_listed``, ``apply_gathered``). What the slot engine needs to know of the kind is
    said by the class attributes below and by its mode (``dynlogits.processors.modes``: planned,
    decided on the host, from the clock, from a span, from the token window)."""

    restrictive = False  # can leave a row with no token (reports ``Dead``)
    positional = False  # needs each row's generated count
    writes_neg_inf = True  # can write ``-inf`` (a later restrictive group must then not settle early)

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        """Whether ``template`` runs resident where the adapter passes no host histories (``group``:
        the group it would join, ``None`` if not made yet; ``token_window``: whether the adapter
        passes a ``TokenWindow``); else its request is hosted there. A plain group: always."""
        return True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        self.level = level
        self.device = device
        self.members: set[int] = set()
        self.member = SlotTable(num_slots, torch.bool, device, pad=0)
        self.tables: list[SlotTable] = []
        self._cache: dict[str, Any] = {}
        #: bumped by every ``flush`` that copied a change of the group's members or tables: what a
        #: layout prepared from them (``prepare``) stands while the generation is the one it saw
        self.generation = 0

    def table(self, dtype: torch.dtype, pad: float | None = None, *, width: int = 1) -> SlotTable:
        made = SlotTable(self.member.num_slots, dtype, self.device, pad=pad, width=width)
        self.tables.append(made)
        return made

    def every_row(self, slot_of_row: torch.Tensor) -> GatheredRows:
        """Every row of a layout with its slot and this group's membership, gathered once while
        ``slot_of_row`` is the same tensor and no table changes (a flush clears the cache)."""
        every = self._cache.get("every")
        if every is None or every.slot_of_row is not slot_of_row:
            every = self._cache["every"] = GatheredRows(slot_of_row, self.member.dev[slot_of_row, 0])
        return every

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:
            if slot in self.members:
                self.members.discard(slot)
                self.member.set(slot, [0])
            return
        self.members.add(slot)
        self.member.set(slot, [1])
        self._write(slot, template)

    def _write(self, slot: int, template: Any) -> None:
        """Write ``template``'s data into this group's tables at ``slot``."""
        raise NotImplementedError

    def flush(self) -> bool:
        """Copy what ``assign`` staged to the device; whether anything changed (the group's cache is
        then cleared and its ``generation`` bumped)."""
        changed = self.member.flush()
        for t in self.tables:
            changed = t.flush() or changed
        if changed:
            self._cache.clear()
            self.generation += 1
        return changed

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Cache what a listed layout's steps reuse (called on every batch change)."""
        self._cache.clear()

    def reads_generated(self, rows: ListedRows) -> bool:
        """Whether a listed layout's step of this group reads ``StepInputs.generated`` (when the runner
        gives ``pos``/``pos_offset``, ``SlotBatch`` subtracts only if some group does)."""
        return True

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> Dead | None:
        """Listed layout: this step on the member ``rows`` (in place); the rows it may leave with no
        token (``None``: none). Not called for a decided group (``modes.DecidedGroup``)."""
        raise NotImplementedError

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> Dead | None:
        """Gathered layout: this step on every row of the step, non-member rows left as they are;
        the rows it may leave with no token (``None``: none). Not called for a decided group."""
        raise NotImplementedError

    def counted_settle(self, step: StepInputs, last: bool) -> CountedSettle | None:
        """A positional group's gathered step at counts its caller gives (``ScopedGroup``: each row's
        stretch) that also settles the rows it leaves with no token, in one op, where it has one for
        ``step`` (``last``: no later group can mask the rows); ``None``: the caller runs
        ``apply_gathered`` at those counts. A plain group: ``None``."""
        return None


class IdsGroup(Group):
    """A group whose tables are one id list per slot (plus whatever a subclass adds)."""

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.ids = self.table(torch.long)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["flat"] = flat_indices(rows, self.ids.dev, stride)


def force_device_decisions(step: StepInputs, rows: GatheredRows, tokens: torch.Tensor) -> Dead:
    """Force ``tokens[r]`` (``-1``: nothing) in every member row ``r`` of a gathered layout, keeping
    masks; the rows it may leave with no token."""
    where = rows.member & (tokens >= 0)
    return Dead(None, rows.slot_of_row, force_gathered(step, tokens, where), step.generated, where=where)


def force_decided_rows(step: StepInputs, rows: ListedRows, decisions: np.ndarray, upload: StepUpload) -> Dead | None:
    """Force ``decisions[i]`` (``-1``: nothing) in member row ``i`` of a listed layout, keeping
    masks: only the rows that force are uploaded (rows, slots, tokens in one upload) and touched."""
    firing = np.flatnonzero(decisions >= 0)
    n = len(firing)
    if not n:
        return None
    buf = upload.buffer(3 * n)
    buf[:n], buf[n : 2 * n], buf[2 * n :] = rows.rows[firing], rows.slots[firing], decisions[firing]
    values = upload.upload(3 * n)
    rows_dev, slots, tokens = values[:n], values[n : 2 * n], values[2 * n :]
    stops = step.stops[slots]
    base = rows_dev * step.stride
    forcing = ListedRows(rows.rows[firing], rows.slots[firing], rows_dev, slots, row_runs(rows.rows[firing].tolist()),
                         base=base)
    witness = force_listed(step, tokens, forcing)
    return Dead(rows_dev, slots, witness, listed_positions(step, rows_dev), base + stops.clamp(min=0), stops >= 0)


def mask_gathered(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> None:
    """``-inf`` at ``ids[r]`` of every row ``r`` where ``where[r]`` (gathered layout)."""
    current = logits.gather(1, ids)
    logits.scatter_(1, ids, current.masked_fill_(where[:, None], NEG_INF))


def listed_positions(step: StepInputs, rows_dev: torch.Tensor, identity: bool = False) -> torch.Tensor | None:
    """The generated count of each of a listed group's rows (``None`` when no group needs them)."""
    if step.generated is None or identity:
        return step.generated
    return step.generated[rows_dev]


def force_listed(step: StepInputs, tokens: torch.Tensor, rows: ListedRows) -> torch.Tensor:
    """Force ``tokens[i]`` in member row ``i``, keeping masks (a ``-inf`` stays, anything else, NaN
    included, becomes 0.0 in a row of ``-inf``); the forced flat indices ``[n, 1]``."""
    assert rows.base is not None
    return force_listed_at(step, rows.base + tokens, rows)


def force_listed_at(step: StepInputs, index: torch.Tensor, rows: ListedRows) -> torch.Tensor:
    """``force_listed`` given the forced flat indices ``[n]``."""
    kept = step.flat.index_select(0, index)
    fill_rows(step.logits, rows.runs, rows.rows_dev)
    step.flat.index_copy_(0, index, torch.where(torch.isneginf(kept), kept, 0.0))
    return index[:, None]


def force_gathered(step: StepInputs, tokens: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Force ``tokens[r]`` in every row ``r`` where ``where[r]``, keeping masks; the forced column
    ids ``[rows, 1]``."""
    index = tokens.clamp(min=0)[:, None]
    kept = step.logits.gather(1, index)
    step.logits.masked_fill_(where[:, None], NEG_INF)
    alive = ~torch.isneginf(kept)
    step.logits.scatter_(1, index, kept.masked_fill_(where[:, None] & alive, 0.0))  # non-members: unchanged
    return index
