"""The resident path's groups: one entry position and template kind, its per-slot device tables,
and the tensor ops that apply it to a step's rows.

A request's entries are applied in order; entry ``k`` of every resident request of a kind forms one
group (``level`` ``k``), so a group's rows are independent and one step is a few tensor ops per
group, whatever the number of rows. Each group runs in one of two layouts:

* **known** (the host knows which row holds which slot: vLLM's V1 runner, Model Runner V2 without
  speculative decoding): member rows and their flat indices into the logits are built once per
  batch change (``prepare``), and a step is ``index_fill_``/``index_add_``/``index_copy_`` over
  those indices plus a memset per run of consecutive rows for the ops that fill whole rows;
* **masked** (only the device knows: Model Runner V2 under speculative decoding): every row
  gathers its slot's table and a membership mask turns the writes of non-member rows into no-ops.

Semantics are those of ``dynlogits.processors.ops`` (forcing never unmasks); a group that
restricts rows to a few ids reports, per row and on the device, whether none of them is left
(``Dead``). Padded table cells repeat one of the row's own ids (bias values pad with 0.0), so they
write the same values twice and never touch another id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dynlogits.processors.templates import (
    BiasTemplate,
    ForceSeqTemplate,
    KeepTemplate,
    MaskBeforeTemplate,
    MaskTemplate,
    Template,
    ThinkingTemplate,
)

from ..plans import fill_rows, row_runs
from dynlogits.uploads import StepUpload

from .staging import SlotTable

__all__ = ["GROUP_TYPES", "Dead", "Group", "KnownRows", "MaskedRows", "StepInputs"]

NEG_INF = -math.inf


@dataclass
class KnownRows:
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
    #: this step's values the host planned for the group (``Group.plan``), on the device, one row
    #: per value (``[planned_per_row, n]``); ``None`` when the host does not know the positions this
    #: step (set by ``SlotBatch`` every step)
    planned: torch.Tensor | None = None


@dataclass
class MaskedRows:
    """Every row of the step with its slot and whether it belongs to the group (device-only)."""

    slot_of_row: torch.Tensor
    member: torch.Tensor


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
    #: the per-slot failure flags a group that settles its empty rows may write itself (``None``:
    #: rows may be drafts, so ``SlotBatch`` decides which rows to flag)
    flags: torch.Tensor | None = None
    #: known layout, positions as the runner holds them (Model Runner V2): ``generated = pos -
    #: pos_offset`` (row-indexed; ``pos_offset`` is the same tensor while the layout stays), for a
    #: group that reads them without the subtraction (``generated`` is then ``None`` unless another
    #: group of the step needs it: ``Group.reads_generated``)
    pos: torch.Tensor | None = None
    pos_offset: torch.Tensor | None = None


@dataclass(slots=True)
class Dead:
    """Rows a restrictive group may leave with no token: the row of slot ``slots[i]``, at output
    position ``positions[i]`` (``None`` when unknown), has none when every id of its ``witness``
    (the ids the group kept) is ``-inf`` once *every* group has run (``evaluate``, as the host path
    does). Known layout: ``rows`` is the rows' device index, ``witness`` flat logits indices
    ``[n, w]`` (with ``stop_index``/``can_stop`` as in ``KnownRows``); masked layout: ``rows`` is
    ``None``, ``witness`` column ids ``[rows, w]`` and ``where`` the rows the group touched
    (``witness`` is ``None`` when the group ``settled`` its rows)."""

    rows: torch.Tensor | None
    slots: torch.Tensor
    witness: torch.Tensor | None
    positions: torch.Tensor | None
    stop_index: torch.Tensor | None = None
    can_stop: torch.Tensor | None = None
    where: torch.Tensor | None = None
    #: the empty rows, already fail-stopped by the group (only their flags remain to be written)
    settled: torch.Tensor | None = None
    #: the group wrote the flags of its empty rows already (``StepInputs.flags``)
    flagged: bool = False

    def evaluate(self, step: StepInputs) -> torch.Tensor:
        """Per row, on the device: whether it has no token left (call after the last group)."""
        if self.settled is not None:
            return self.settled
        assert self.witness is not None
        if self.rows is not None:
            n = self.witness.shape[0]
            return torch.isneginf(step.flat.index_select(0, self.witness.reshape(-1)).view(n, -1)).all(1)
        dead = torch.isneginf(step.logits.gather(1, self.witness)).all(1)
        return dead if self.where is None else dead & self.where


def _flat(rows: KnownRows, ids: torch.Tensor, stride: int) -> torch.Tensor:
    """Flat logits indices of each member row's table ids: ``[n * width]``."""
    return (rows.rows_dev[:, None] * stride + ids[rows.slots_dev]).reshape(-1)


class Group:
    """Entry position ``level`` of one template kind, for every slot that has one there."""

    template_type: type = object
    restrictive = False  # can leave a row with no token (reports ``Dead``)
    positional = False  # needs each row's generated count
    #: values per member row ``plan`` writes when the host knows the positions (0: it plans nothing)
    planned_per_row = 0

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        self.level = level
        self.device = device
        self.members: set[int] = set()
        self.member = SlotTable(num_slots, torch.bool, device, pad=0)
        self.tables: list[SlotTable] = []
        self._cache: dict[str, Any] = {}

    def table(self, dtype: torch.dtype, pad: float | None = None) -> SlotTable:
        made = SlotTable(self.member.num_slots, dtype, self.device, pad=pad)
        self.tables.append(made)
        return made

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
        raise NotImplementedError

    def flush(self) -> bool:
        changed = self.member.flush()
        for t in self.tables:
            changed = t.flush() or changed
        if changed:
            self._cache.clear()
        return changed

    def prepare(self, rows: KnownRows, stride: int) -> None:
        """Cache what a known layout's steps reuse (called on every batch change)."""
        self._cache.clear()

    def reads_generated(self, rows: KnownRows) -> bool:
        """Whether a known layout's step of this group reads ``StepInputs.generated`` (when the runner
        gives ``pos``/``pos_offset``, ``SlotBatch`` subtracts only if some group does)."""
        return True

    def plan(self, rows: KnownRows, counts: list[int], generated: np.ndarray, out: np.ndarray) -> None:
        """Known layout, positions known on the host (row-indexed, as a list, ``counts``, and as an
        array, ``generated``): write this step's ``planned_per_row * len(rows.rows)`` values into
        ``out``; they reach ``apply_known`` as ``rows.planned`` in the step's one upload, sparing
        the device the ops that derive them."""
        raise NotImplementedError

    def apply_known(self, step: StepInputs, rows: KnownRows) -> Dead | None:
        raise NotImplementedError

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> Dead | None:
        raise NotImplementedError


class _IdsGroup(Group):
    """A group whose tables are one id list per slot (plus whatever a subclass adds)."""

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.ids = self.table(torch.long)

    def prepare(self, rows: KnownRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["flat"] = _flat(rows, self.ids.dev, stride)


def _mask_masked(logits: torch.Tensor, ids: torch.Tensor, where: torch.Tensor) -> None:
    current = logits.gather(1, ids)
    logits.scatter_(1, ids, current.masked_fill_(where[:, None], NEG_INF))


class MaskGroup(_IdsGroup):
    template_type = MaskTemplate

    def _write(self, slot: int, template: MaskTemplate) -> None:
        self.ids.set(slot, template.ids)

    def apply_known(self, step: StepInputs, rows: KnownRows) -> None:
        step.flat.index_fill_(0, self._cache["flat"], NEG_INF)

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> None:
        _mask_masked(step.logits, self.ids.dev[rows.slot_of_row], rows.member)


class BiasGroup(_IdsGroup):
    template_type = BiasTemplate

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.values = self.table(torch.float32, pad=0.0)

    def _write(self, slot: int, template: BiasTemplate) -> None:
        self.ids.set(slot, template.ids)
        self.values.set(slot, template.values)

    def prepare(self, rows: KnownRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["values"] = self.values.dev[rows.slots_dev].reshape(-1)

    def apply_known(self, step: StepInputs, rows: KnownRows) -> None:
        values = self._cache["values"]
        if values.dtype != step.flat.dtype:
            values = self._cache["values"] = values.to(step.flat.dtype)
        step.flat.index_add_(0, self._cache["flat"], values)

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> None:
        values = self.values.dev[rows.slot_of_row] * rows.member[:, None]
        step.logits.scatter_add_(1, self.ids.dev[rows.slot_of_row], values.to(step.logits.dtype))


class KeepGroup(_IdsGroup):
    template_type = KeepTemplate
    restrictive = True

    def _write(self, slot: int, template: KeepTemplate) -> None:
        self.ids.set(slot, template.ids)

    def apply_known(self, step: StepInputs, rows: KnownRows) -> Dead:
        flat = self._cache["flat"]
        kept = step.flat.index_select(0, flat)
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        step.flat.index_copy_(0, flat, kept)
        return Dead(rows.rows_dev, rows.slots_dev, flat.view(len(rows.rows), -1),
                    _positions(step, rows.rows_dev, rows.identity), rows.stop_index, rows.can_stop)

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> Dead:
        ids = self.ids.dev[rows.slot_of_row]
        kept = step.logits.gather(1, ids)
        step.logits.masked_fill_(rows.member[:, None], NEG_INF)
        step.logits.scatter_(1, ids, kept)
        return Dead(None, rows.slot_of_row, ids, step.generated, where=rows.member)


def _positions(step: StepInputs, rows_dev: torch.Tensor, identity: bool = False) -> torch.Tensor | None:
    if step.generated is None or identity:
        return step.generated
    return step.generated[rows_dev]


def _force_known(step: StepInputs, tokens: torch.Tensor, rows: KnownRows) -> torch.Tensor:
    """Force ``tokens[i]`` in member row ``i``, keeping masks (a ``-inf`` stays, anything else, NaN
    included, becomes 0.0 in a row of ``-inf``); the forced flat indices ``[n, 1]``."""
    assert rows.base is not None
    return _force_known_at(step, rows.base + tokens, rows)


def _force_known_at(step: StepInputs, index: torch.Tensor, rows: KnownRows) -> torch.Tensor:
    """``_force_known`` given the forced flat indices ``[n]``."""
    kept = step.flat.index_select(0, index)
    fill_rows(step.logits, rows.runs, rows.rows_dev)
    step.flat.index_copy_(0, index, torch.where(torch.isneginf(kept), kept, 0.0))
    return index[:, None]


def _force_masked(step: StepInputs, tokens: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Force ``tokens[r]`` in every row ``r`` where ``where[r]``, keeping masks; the forced column
    ids ``[rows, 1]``."""
    index = tokens.clamp(min=0)[:, None]
    kept = step.logits.gather(1, index)
    step.logits.masked_fill_(where[:, None], NEG_INF)
    alive = ~torch.isneginf(kept)
    step.logits.scatter_(1, index, kept.masked_fill_(where[:, None] & alive, 0.0))  # non-members: unchanged
    return index


class ForceSeqGroup(Group):
    """``forced_sequence``: a row that has generated ``g`` tokens forces ``sequence[g]``, EOS once
    the sequence is spent, ``sequence[0]`` while still in prefill (``g < 0``). A row left with no
    token reports ``min(g, length)``: past its end, the position where its EOS was first due."""

    template_type = ForceSeqTemplate
    restrictive = True
    positional = True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.sequence = self.table(torch.long)  # the tokens, then EOS (the padding repeats EOS)
        self.length = self.table(torch.long)

    def _write(self, slot: int, template: ForceSeqTemplate) -> None:
        self.sequence.set(slot, (*template.tokens, template.eos))
        self.length.set(slot, [len(template.tokens)])

    #: per member row: the forced flat index, the sentinel slot (``_settle``'s "no flag"), the position
    planned_per_row = 3

    def prepare(self, rows: KnownRows, stride: int) -> None:
        super().prepare(rows, stride)
        n = len(rows.rows)
        # for ``plan``: each row's sequence as flat logits indices, and its length (host copies)
        self._cache["host_flat"] = rows.rows[:, None] * stride + self.sequence.host_np[rows.slots]
        self._cache["host_length"] = self.length.host_np[rows.slots, 0]
        self._cache["host_rows"] = np.arange(n)
        if n <= self._FEW_ROWS:  # ``plan`` in Python: the same tables as lists
            self._cache["few"] = list(zip(rows.rows.tolist(), self._cache["host_length"].tolist(),
                                          self._cache["host_flat"].tolist()))
        self._cache["sequence"] = self.sequence.dev[rows.slots_dev]
        self._cache["length"] = self.length.dev[rows.slots_dev, 0]
        self._cache["zero"] = torch.zeros_like(self._cache["length"])
        if self._settles(rows):
            self._prepare_settle(rows)

    @staticmethod
    def _settles(rows: KnownRows) -> bool:
        """No later group can mask these rows (``_settle``)."""
        return rows.last

    def reads_generated(self, rows: KnownRows) -> bool:
        return not self._settles(rows)  # a settle reads ``pos`` directly (``_pick``)

    def _prepare_settle(self, rows: KnownRows) -> None:
        """The tables ``_pick`` reads. Each row's position is turned into a column ``c`` by
        counting the row's bounds at or below it (``searchsorted``): bounds ``offset + [0, 1, ..,
        length]`` give ``c = clamp(generated + 1, 0, length + 1)``, ``c = 0`` for a row still in
        prefill (its sample is discarded). Per row and column, five planes: the forced token's flat
        index (column ``c`` forces ``sequence[max(c - 1, 0)]``, EOS once the sequence is spent);
        the flag slot of a row that keeps it (the sentinel: no flag); what replaces both where the
        token is masked (its stop token's index; its own slot, the sentinel in prefill); and the
        position a flag records (``c - 1``: the generated count, at most the sequence's length)."""
        n = len(rows.rows)
        assert rows.base is not None and rows.stop_index is not None
        sentinel = self._sentinel
        sequence = self._cache["sequence"]
        width = sequence.shape[1]  # the longest sequence + its EOS
        flat = rows.base[:, None] + torch.cat([sequence[:, :1], sequence], 1)  # [n, width + 1]
        dead_slot = rows.slots_dev[:, None].expand(n, width + 1).clone()
        dead_slot[:, :1].fill_(sentinel)
        position = torch.arange(-1, width, device=flat.device).expand(n, width + 1)
        self._cache["table"] = torch.stack([flat, torch.full_like(flat, sentinel),
                                            rows.stop_index[:, None].expand(n, width + 1), dead_slot, position])
        steps = torch.arange(width, device=flat.device).expand(n, width)
        self._cache["steps"] = steps
        self._cache["beyond"] = steps > self._cache["length"][:, None]  # bounds past a row's length
        self._cache["bounds"] = None
        # the planned step's stand-in for the third and fourth planes
        self._cache["if_dead"] = torch.stack([rows.stop_index, rows.slots_dev])

    @property
    def _sentinel(self) -> int:
        """The tables' last slot, never assigned: a flag written there is no flag."""
        return self.member.num_slots - 1

    _NEVER = 2**31 - 1  # a bound no position reaches (fits int32 positions too)

    def _pick(self, step: StepInputs, rows: KnownRows) -> torch.Tensor:
        """``[5, n]``: this step's column of every plane of ``_prepare_settle``'s table, from
        ``pos`` (against ``pos_offset``) or ``generated``: two ops, whatever the runner gives."""
        n = len(rows.rows)
        values, offset = (step.pos, step.pos_offset) if step.pos is not None else (step.generated, None)
        assert values is not None
        if not rows.identity:
            values = values[rows.rows_dev]
        bounds = self._cache["bounds"]
        if bounds is None or bounds[0] is not offset or bounds[1].dtype != values.dtype:
            at = self._cache["steps"] if offset is None else self._cache["steps"] + (
                offset if rows.identity else offset[rows.rows_dev])[:, None]
            bounds = self._cache["bounds"] = (offset, at.masked_fill(self._cache["beyond"], self._NEVER).to(values.dtype))
        column = torch.searchsorted(bounds[1], values.view(n, 1), right=True)
        return self._cache["table"].gather(2, column.view(1, n, 1).expand(5, n, 1)).view(5, n)

    @staticmethod
    def _tokens(generated: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                zero: torch.Tensor | None = None) -> torch.Tensor:
        """``sequence[i, clamp(generated[i], 0, length[i])]`` (a row still in prefill counts
        negative: the runner discards what is sampled there)."""
        column = torch.clamp(generated, zero, length) if zero is not None else generated.clamp(min=0).minimum(length)
        return sequence.gather(1, column[:, None]).view(-1)

    #: up to this many rows ``plan`` runs in Python: a numpy call's fixed cost (several us with cold
    #: caches, as after a forward pass) exceeds a loop over a few rows
    _FEW_ROWS = 8

    def plan(self, rows: KnownRows, counts: list[int], generated: np.ndarray, out: np.ndarray) -> None:
        """``[forced flat index | sentinel slot | position]`` per member row (the position capped at
        the sequence's length, as everywhere in this group): on the host, what ``_pick`` would
        otherwise derive on the device each step."""
        n = len(rows.rows)
        few = self._cache.get("few")
        if few is not None:
            positions = [min(counts[row], length) for row, length, _ in few]
            out[:] = [flat[p] for (_, _, flat), p in zip(few, positions)] + [self._sentinel] * n + positions
            return
        positions = out[2 * n :]
        if not rows.identity:
            generated = np.take(generated, rows.rows, out=positions)
        np.minimum(generated, self._cache["host_length"], out=positions)  # host counts are never negative
        out[:n] = self._cache["host_flat"][self._cache["host_rows"], positions]
        out[n : 2 * n] = self._sentinel

    def _planned_views(self, planned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``rows.planned``'s parts: ``[index, sentinel]`` (``_settle``'s ``picked``), the forced flat
        indices, the positions; taken once, as ``planned`` is one tensor while the layout stays."""
        views = self._cache.get("planned")
        if views is None or views[0] is not planned:
            index, _, positions = planned.unbind(0)
            views = self._cache["planned"] = (planned, planned[:2], index, positions)
        return views[1:]

    def apply_known(self, step: StepInputs, rows: KnownRows) -> Dead:
        assert rows.stop_index is not None and rows.base is not None
        planned = None if rows.planned is None else self._planned_views(rows.planned)
        if self._settles(rows):
            if planned is not None:
                picked, index, positions = planned
                return self._settle(step, rows, picked, index, self._cache["if_dead"], positions)
            picked = self._pick(step, rows)
            index, _, _, _, positions = picked.unbind(0)
            return self._settle(step, rows, picked[:2], index, picked[2:4], positions)
        if planned is not None:
            _, index, positions = planned
            witness = _force_known_at(step, index, rows)
        else:
            assert step.generated is not None
            generated = _positions(step, rows.rows_dev, rows.identity)
            assert generated is not None
            tokens = self._tokens(generated, self._cache["sequence"], self._cache["length"], self._cache["zero"])
            witness = _force_known(step, tokens, rows)
            positions = generated.minimum(self._cache["length"])
        return Dead(rows.rows_dev, rows.slots_dev, witness, positions, rows.stop_index, rows.can_stop)

    def _settle(self, step: StepInputs, rows: KnownRows, picked: torch.Tensor, index: torch.Tensor,
                if_dead: torch.Tensor, positions: torch.Tensor) -> Dead:
        """Settle the rows here (``_settles``), in as few launches as the step allows: each row gets
        its forced token, or its stop token where the forced one is masked (then its flag too, when
        ``step.flags`` is given; a row without a stop token is flagged and left with no token, as
        ``_record_dead`` would). ``picked``: the forced flat indices and the no-flag slots, ``[2,
        n]`` (``index`` is its first row); ``if_dead``: what replaces them on a masked row;
        ``positions``: what a flag records."""
        kept = step.flat.index_select(0, index)
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        dead = torch.isneginf(kept)
        if rows.can_stop is None:
            target, flag_slot = torch.where(dead, if_dead, picked).unbind(0)
            step.flat.index_fill_(0, target, 0.0)
        else:  # a masked row without a stop token is only flagged: -inf goes back onto its forced id
            stops, dead_value, live_value = self._without_stops(rows, step.flat.dtype)
            target, flag_slot = torch.where(dead & stops, if_dead, picked).unbind(0)
            step.flat.index_copy_(0, target, torch.where(dead, dead_value, live_value))
        if step.flags is not None:
            step.flags.scatter_reduce_(0, flag_slot, positions, reduce="amax")
        return Dead(rows.rows_dev, rows.slots_dev, None, positions, rows.stop_index, rows.can_stop,
                    settled=dead, flagged=step.flags is not None)

    def _without_stops(self, rows: KnownRows, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For ``_settle`` when some rows have no stop token: ``[2, n]`` masks of the rows whose
        ``if_dead`` replaces ``picked`` where their token is masked (the target: rows with a stop
        token; the flag slot: every row), the logit a masked row's target gets (0.0 at its stop
        token, ``-inf`` without one) and the one a live row's forced id gets (0.0)."""
        cached = self._cache.get("without_stops")
        if cached is None or cached[1].dtype != dtype:
            can_stop = rows.can_stop
            assert can_stop is not None
            dead_value = torch.where(can_stop, 0.0, NEG_INF).to(dtype)
            cached = self._cache["without_stops"] = (torch.stack([can_stop, torch.ones_like(can_stop)]), dead_value,
                                                     torch.zeros_like(dead_value))
        return cached

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> Dead:
        assert step.generated is not None
        slots = rows.slot_of_row
        length = self.length.dev[slots, 0]
        tokens = self._tokens(step.generated, self.sequence.dev[slots], length)
        return Dead(None, slots, _force_masked(step, tokens, rows.member), step.generated.minimum(length), where=rows.member)


class MaskBeforeGroup(_IdsGroup):
    template_type = MaskBeforeTemplate
    positional = True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.minimum = self.table(torch.long)

    def _write(self, slot: int, template: MaskBeforeTemplate) -> None:
        self.ids.set(slot, template.ids)
        self.minimum.set(slot, [template.min_tokens])

    def prepare(self, rows: KnownRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["minimum"] = self.minimum.dev[rows.slots_dev, 0]

    def apply_known(self, step: StepInputs, rows: KnownRows) -> None:
        assert step.generated is not None
        flat = self._cache["flat"]
        positions = _positions(step, rows.rows_dev, rows.identity)
        active = positions < self._cache["minimum"]  # type: ignore[operator]
        current = step.flat.index_select(0, flat)
        step.flat.index_copy_(0, flat, current.masked_fill_(active[:, None].expand(-1, self.ids.width).reshape(-1), NEG_INF))

    def apply_masked(self, step: StepInputs, rows: MaskedRows) -> None:
        assert step.generated is not None
        active = rows.member & (step.generated < self.minimum.dev[rows.slot_of_row, 0])
        _mask_masked(step.logits, self.ids.dev[rows.slot_of_row], active)


class ThinkingGroup(Group):
    """``thinking_budget``: whether and what to force depends on the tokens written, which the
    adapter decides (``decisions``: the end token to force per member row, ``-1`` for none): on
    the host from the live history (V1 runner), or on the device (``dynlogits.sdk.resident.thinking``)."""

    template_type = ThinkingTemplate
    restrictive = True

    def _write(self, slot: int, template: ThinkingTemplate) -> None:
        pass  # decided from the request's own processor (host) or the device decider's tables

    def apply_decided(self, step: StepInputs, rows: KnownRows, decisions: np.ndarray, upload: StepUpload) -> Dead | None:
        """Known layout, host decisions: only the rows that force are touched."""
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
        forcing = KnownRows(rows.rows[firing], rows.slots[firing], rows_dev, slots, row_runs(rows.rows[firing].tolist()),
                            base=base)
        witness = _force_known(step, tokens, forcing)
        return Dead(rows_dev, slots, witness, _positions(step, rows_dev), base + stops.clamp(min=0), stops >= 0)

    def apply_device(self, step: StepInputs, rows: MaskedRows, tokens: torch.Tensor) -> Dead:
        """Device decisions (``tokens[r]``, -1 for none) over every row."""
        where = rows.member & (tokens >= 0)
        return Dead(None, rows.slot_of_row, _force_masked(step, tokens, where), step.generated, where=where)


GROUP_TYPES: dict[type, type[Group]] = {
    g.template_type: g for g in (MaskGroup, BiasGroup, KeepGroup, ForceSeqGroup, MaskBeforeGroup, ThinkingGroup)
}
