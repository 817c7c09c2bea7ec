"""The listed layout: the host knows which slot each logits row holds (vLLM's V1 runner, Model
Runner V2 without drafts).

Member rows, their flat indices and each group's cached tables are built once per batch change
(``prepare``: one non-blocking upload of every group's rows and slots); a step reuses them. Where
the host knows the positions (``EngineStep.histories``), every row's generated count and what the
planned groups plan from it go up in one non-blocking upload per step; decided groups are decided
on the host from the histories, else on the device (``deciding``).

Guarantees: nothing is read back; rows of slots with no resident request are never written; rows
of failed requests get only their stop token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dynlogits.processors.modes import ClockDecided, DecidedGroup, PlannedGroup, SpanDecided
from dynlogits.processors.ops import fill_rows, row_runs
from dynlogits.processors.slots import Dead, Group, ListedRows, StepInputs
from dynlogits.processors.uploads import StepUpload, StepValues

from .batch_view import BatchView
from .deciding import NO_HISTORIES, decide_on_device, decide_rows_on_host, decide_slots_on_host, in_span
from .engine_step import EngineStep

__all__ = ["ListedLayout"]


def _member_rows(slot_of_row: np.ndarray, slots: set[int], sentinel: int) -> np.ndarray:
    """The rows whose slot is in ``slots`` (``slot_of_row``: the sentinel for rows of no resident
    request, never in ``slots``), ascending: one lookup table indexed by slot."""
    member = np.zeros(sentinel + 1, dtype=bool)
    member[np.fromiter(slots, dtype=np.int64, count=len(slots))] = True
    return np.flatnonzero(member[slot_of_row])


class ListedLayout:
    """The host knows which slot each logits row holds (``set_rows``): member rows, their flat
    indices and each group's cached tables are built once per batch change (``prepare``: one
    non-blocking upload of every group's rows), and a step reuses them."""

    def __init__(self, batch: BatchView) -> None:
        self.batch = batch
        self.host_slots: np.ndarray | None = None  # row -> slot (-1: no resident request)
        self.dirty = True  # the slots or their occupants changed since ``prepare``
        self.stride: int | None = None
        self.dtype: torch.dtype | None = None
        self.slot_of_row: torch.Tensor | None = None  # ``host_slots`` on the device (the sentinel for -1)
        self.rows: dict[tuple[int, type[Group]], ListedRows] = {}
        self.steps: list[tuple[Group, ListedRows]] = []  # the groups with member rows, in entry order
        self.failed: ListedRows | None = None  # rows of failed requests
        self.failed_now: list[int] = []  # rows whose request failed on the host during this step
        #: per step the host writes each row's generated count, then what the groups plan
        #: (``planners``), into one device tensor kept for the layout's life
        self.step_values = StepValues(torch.long, batch.device)
        self.planners: list[tuple[PlannedGroup, ListedRows, int, int, torch.Tensor]] = []
        self.generated_view: torch.Tensor | None = None  # ``step_values``' counts, when a group reads them
        self.positions_needed = False  # a group with member rows is positional
        self.generated_needed = False  # a group with member rows reads ``StepInputs.generated``
        self._decisions = StepUpload(torch.long, batch.device)  # host-decided tokens
        self._layout = StepUpload(torch.long, batch.device)  # the rows and slots of every group
        #: per group, what its last ``prepare`` was for (``_kept``): the group's ``generation``, its
        #: rows and the logits' stride
        self._prepared: dict[tuple[int, type[Group]], tuple[int, ListedRows, int]] = {}

    def set_rows(self, host_slots: np.ndarray) -> None:
        self.host_slots = np.asarray(host_slots, dtype=np.int64)
        self.dirty = True

    def _rows(self, rows: np.ndarray, stride: int, rows_dev: torch.Tensor, slots_dev: torch.Tensor) -> ListedRows:
        batch, host = self.batch, self.host_slots
        assert host is not None
        slots = host[rows]
        stops = batch.stop.dev[slots_dev, 0]
        base = rows_dev * stride
        every_stops = all(batch.requests[s] is not None and batch.requests[s].stop_token_id is not None
                          for s in slots.tolist())
        identity = bool(np.array_equal(rows, np.arange(len(host))))
        return ListedRows(rows, slots, rows_dev, slots_dev, row_runs(rows.tolist()), stop_index=base + stops.clamp(min=0),
                          can_stop=None if every_stops else stops >= 0, base=base, identity=identity)

    def prepare(self, stride: int, dtype: torch.dtype) -> None:
        """Member rows (and each group's cached indices) for the current rows: the host arrays of
        every group go to the device in one non-blocking upload. A group whose member rows, slots
        and tables are as at its last ``prepare`` (``_kept``) keeps its ``ListedRows`` and caches
        (a plan laid out ahead among them): nothing of it is uploaded or rebuilt."""
        batch, host = self.batch, self.host_slots
        assert host is not None
        in_step = host >= 0
        slot_of_row = np.where(in_step, host, batch.sentinel)
        members = [(key, _member_rows(slot_of_row, group.members, batch.sentinel))
                   for key, group in batch.groups.items() if group.members]
        members = [(key, rows) for key, rows in members if len(rows)]
        last = {key: not (batch.groups[key].members & batch.masking_after(key[0])) for key, _ in members}
        kept = {key: listed for key, rows in members
                if (listed := self._kept(key, rows, host[rows], stride, last[key])) is not None}
        built = [(key, rows) for key, rows in members if key not in kept]
        failed = (_member_rows(slot_of_row, batch.failures.failed, batch.sentinel) if batch.failures.failed
                  else np.empty(0, np.int64))
        parts = [slot_of_row]
        for _, rows in [*built, (None, failed)]:
            parts += [rows, host[rows]]
        packed = np.concatenate(parts).astype(np.int64, copy=False)
        self._layout.buffer(len(packed))[:] = packed
        views = iter(self._layout.upload(len(packed), keep=True).split([len(p) for p in parts]))
        self.slot_of_row = next(views)
        self.rows = dict(kept)
        for key, rows in built:
            group = batch.groups[key]
            listed = self.rows[key] = self._rows(rows, stride, next(views), next(views))
            listed.last = last[key]
            group.prepare(listed, stride)
            self._mark_prepared(key, group, listed, stride)
        self.failed = self._rows(failed, stride, next(views), next(views)) if len(failed) else None
        self.steps = [(batch.groups[key], self.rows[key]) for key in sorted(self.rows, key=lambda k: k[0])]
        self.positions_needed = any(group.positional for group, _ in self.steps)
        self.generated_needed = any(group.reads_generated(rows) for group, rows in self.steps)
        self._plan_step_values(len(host))
        self.stride, self.dtype = stride, dtype
        self.dirty = False

    def _mark_prepared(self, key: tuple[int, type[Group]], group: Group, listed: ListedRows, stride: int) -> None:
        """Remember what ``group`` was prepared for; a decided group is never kept (its per-layout
        deciders are rebuilt with its rows)."""
        if isinstance(group, DecidedGroup):
            self._prepared.pop(key, None)
            return
        self._prepared[key] = (group.generation, listed, stride)

    def _kept(self, key: tuple[int, type[Group]], rows: np.ndarray, slots: np.ndarray, stride: int,
              last: bool) -> ListedRows | None:
        """``key``'s ``ListedRows`` from an earlier ``prepare`` if it still stands: the group's
        ``generation`` unchanged since (no flush changed its members or tables), the same rows,
        slots, stride, ``last`` and ``identity`` (the rows are every row of the layout)."""
        prepared = self._prepared.get(key)
        if prepared is None:
            return None
        generation, listed, was_stride = prepared
        group = self.batch.groups[key]
        assert self.host_slots is not None
        if (group.generation != generation or was_stride != stride or listed.last != last
                or listed.identity != (len(rows) == len(self.host_slots))
                or not np.array_equal(listed.rows, rows) or not np.array_equal(listed.slots, slots)):
            return None
        return listed

    def _plan_step_values(self, n: int) -> None:
        """Lay out ``step_values`` for this layout: ``n`` generated counts, then each planning
        group's values; the views the steps read are taken here, once."""
        self.planners = []
        if not self.positions_needed:
            self.generated_view = None
            return
        spans, size = [], n
        for group, rows in self.steps:
            if isinstance(group, PlannedGroup) and group.planned_per_row:
                spans.append((group, rows, size, size + group.planned_per_row * len(rows.rows)))
                size = spans[-1][3]
        dev = self.step_values.resize(size)
        self.generated_view = dev[:n] if self.generated_needed else None
        self.planners = [(group, rows, start, stop, dev[start:stop].view(group.planned_per_row, -1))
                         for group, rows, start, stop in spans]

    def step(self, logits: torch.Tensor, engine: EngineStep) -> tuple[StepInputs, list[Dead]] | None:
        """One step (``SlotBatch.apply``); ``None`` before the first ``set_rows``."""
        if self.host_slots is None:
            return None
        histories, generated, pos, pos_offset = engine.histories, engine.generated, engine.pos, engine.pos_offset
        batch = self.batch
        if self.dirty or self.stride != logits.stride(0) or self.dtype != logits.dtype:
            batch.flush()
            self.prepare(logits.stride(0), logits.dtype)
        if generated is None and histories is not None and self.positions_needed:
            generated = self._upload_positions(histories)
        else:
            for _, rows, _, _, _ in self.planners:
                rows.planned = None
        if pos is not None and generated is None and self.generated_needed:
            assert pos_offset is not None
            generated = pos - pos_offset
        step = batch.step_inputs(logits, generated, drafts=False, pos=pos, pos_offset=pos_offset)
        deaths = []
        for group, rows in self.steps:
            dead = (self._decided(group, step, rows, engine) if isinstance(group, DecidedGroup)
                    else group.apply_listed(step, rows))
            if dead is not None:
                deaths.append(dead)
        if self.failed is not None:
            self._fail_stop(step, self.failed)
        for row in self.failed_now:  # failed on the host during this step
            request = batch.requests[int(self.host_slots[row])]
            if request is not None:
                request.force_stop(logits[row])
        self.failed_now.clear()
        return step, deaths

    def _upload_positions(self, histories: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Positions on the host: every row's generated count and what the groups plan from it
        (``PlannedGroup.plan``), in one non-blocking upload; the row-indexed counts on the device (``None``
        when no group reads them)."""
        assert self.host_slots is not None
        n = len(self.host_slots)
        if len(histories) != n:
            raise ValueError(f"{len(histories)} histories for a layout of {n} rows")
        buf = self.step_values.host()
        counts = list(map(len, histories))
        buf[:n] = counts
        generated = buf[:n]
        for group, rows, start, stop, planned in self.planners:
            group.plan(rows, counts, generated, buf[start:stop])
            rows.planned = planned
        self.step_values.push()
        return self.generated_view

    def _decided(self, group: DecidedGroup, step: StepInputs, rows: ListedRows, engine: EngineStep) -> Dead | None:
        """A decided group: on the host from ``histories`` (or with none, for a group that reads
        none), else on the device over every row (``Group.every_row``)."""
        histories = engine.histories
        if histories is None and isinstance(group, ClockDecided) and isinstance(group, SpanDecided):
            return self._clock_in_span(group, step, rows, engine)
        if histories is not None or isinstance(group, ClockDecided):
            decisions = decide_rows_on_host(self.batch, group, rows, histories if histories is not None else NO_HISTORIES,
                                            self.failed_now)
            return group.apply_host_decisions(step, rows, decisions, self._decisions)
        assert self.slot_of_row is not None
        return decide_on_device(group, step, group.every_row(self.slot_of_row), engine.thinking, engine.window)

    def _clock_in_span(self, group: DecidedGroup, step: StepInputs, rows: ListedRows, engine: EngineStep) -> Dead | None:
        """A clock within a span without host histories (a scoped ``deadline``): each member row's
        clock on the host (``deciding.decide_slots_on_host``), nothing on the device unless one is
        due; then the tokens per row go up in one upload, kept where the span decider finds the row
        in the group's phase (``deciding.in_span``), and forced as a gathered step."""
        tokens = decide_slots_on_host(self.batch, group, rows.slots.tolist())
        if not (tokens >= 0).any():
            return None
        assert self.slot_of_row is not None
        n = len(self.slot_of_row)
        buf = self._decisions.buffer(n)
        buf[:] = -1
        buf[rows.rows] = tokens
        every = group.every_row(self.slot_of_row)
        return group.apply_device_decisions(step, every, in_span(group, every, self._decisions.upload(n), engine))

    def _fail_stop(self, step: StepInputs, rows: ListedRows) -> None:
        """Rows of failed requests: only their stop token (a deliberate override of every mask)."""
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        stops = self.batch.stop.dev[rows.slots_dev, 0]
        step.flat.index_fill_(0, rows.rows_dev * step.stride + stops, 0.0)
