"""The resident apply path: built-in processors kept on the device, per persistent request slot.

``SlotBatch`` compiles each resident request (``GuardedRequest.resident``) into per-slot device
tables when it enters a slot and runs a step as a few tensor ops per group of entries (each kind's
``Group``, ``dynlogits.processors.slots``); it knows kinds only through their groups. Layouts:
``ListedLayout`` (the host knows each row's slot) and ``GatheredLayout`` (only the device does).
Steady steps read nothing back and build no tensor from a host list.

Lifecycle: ``assign(slot, request)`` as requests enter (``None`` clears), ``flush()`` once per batch
change; ``set_rows(host_slots)`` or, each step, ``rows_on_device(slot_of_row, slots)``; ``apply(logits, ...)``.

Assumptions (the adapter's side):

* slots are the engine's persistent indices in ``[0, num_slots)``, reused only after ``assign``;
* ``flush()`` runs after a batch change's ``assign`` calls and before the next ``apply``;
* ``logits`` is ``[rows, vocab_size]`` on ``device``, each row in the slot last named for it;
* ``generated`` counts the tokens a row's request generated before that row, drafts included.

Guarantees:

* a slot's program is exactly its last assigned request's;
* rows of slots with no resident request are never written;
* ``apply`` never raises for one request's data and never undoes an engine's ``-inf``, except to
  fail-stop a failed request to its stop token;
* a failure touches only that request's rows: a row left with no token is fail-stopped on the
  device in the same step, and its request (the slot's occupant when the flags' copy was queued) is
  failed once the copy lands (``readback``); a draft row (``real_rows`` false) stops that row only."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dynlogits.processors.modes import ClockDecided, DecidedGroup, PlannedGroup, WindowDecided
from dynlogits.processors.ops import fill_rows, row_runs
from dynlogits.processors.slots import Dead, GatheredRows, Group, ListedRows, SlotTable, StepInputs
from dynlogits.processors.uploads import StepUpload, StepValues
from dynlogits.processors.window import TokenWindow

from ..guard import NO_TOKEN_LEFT, GuardedRequest
from ..readback import INBOX
from .engine_step import NO_INPUT, EngineStep, ThinkingDecider
from .flags import FlagSnapshot, SlotFlags

__all__ = ["GatheredLayout", "ListedLayout", "SlotBatch", "ThinkingDecider"]

NEG_INF = -math.inf



class _NoHistories:
    """Every row's history, for a group that reads none (``modes.ClockDecided``): empty."""

    def __getitem__(self, row: int) -> tuple[()]:
        return ()


NO_HISTORIES = _NoHistories()


class SlotBatch:
    """Per-slot device programs of an engine's resident requests (see the module doc)."""

    def __init__(self, *, num_slots: int, vocab_size: int, device: torch.device | str, host_histories: bool = False,
                 token_window: bool = False) -> None:
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        #: whether the adapter passes every row's history to ``apply`` (listed layout): without them a
        #: request with a group that needs them (``Group.runs_without_histories``) is not resident
        self.host_histories = host_histories
        #: whether the adapter passes a ``TokenWindow`` to every ``apply``: a group decided from it
        #: (``modes.WindowDecided``) is then resident without host histories
        self.token_window = token_window
        self.requests: list[GuardedRequest | None] = [None] * num_slots
        #: (entry position, group type) -> the group holding every slot with such an entry there
        self.groups: dict[tuple[int, type[Group]], Group] = {}
        #: tables have one more row than there are slots: the sentinel ``num_slots``, never
        #: assigned, stands for rows that hold no resident request
        self.sentinel = num_slots
        self.stop = SlotTable(num_slots + 1, torch.long, self.device, pad=-1)  # each slot's stop token, or -1
        self._stops: tuple[torch.Tensor, torch.Tensor] | None = None  # (stop.dev, its column 0) for step_inputs
        self.failed: set[int] = set()  # slots whose request failed: fail-stopped every step
        self.failed_member = SlotTable(num_slots + 1, torch.bool, self.device, pad=0)
        self.flags = SlotFlags(num_slots + 1, self.device)  # output position a slot's row was left empty, or -1
        self._no_flags = np.full(num_slots, self.flags.fill, dtype=np.int64).tobytes()  # none flagged, as bytes
        self._minus_one = torch.full((), -1, dtype=torch.long, device=self.device)
        self._flags_written = False  # flags written since the last snapshot was queued
        #: requests a landed snapshot failed (possibly on the watcher thread), fail-stopped in their
        #: current slot at the next ``apply``/``flush``
        self._newly_failed: deque[GuardedRequest] = deque()
        self._ordered: list[Group] = []  # ``groups`` in entry order (``group_order``)
        self.slot_decisions = StepUpload(torch.long, self.device)  # per-slot host decisions, gathered layouts
        self.listed = ListedLayout(self)
        self.gathered: GatheredLayout | None = None  # set for a step by ``rows_on_device``

    # -- batch changes ----------------------------------------------------------------------------
    def assign(self, slot: int, request: GuardedRequest | None) -> bool:
        """Put ``request``'s program in ``slot`` (``None``, or a request that is not resident here,
        clears it); returns whether the slot now holds a resident request."""
        self._detach(slot)
        self._set_failed(slot, False)
        self.requests[slot] = None
        resident = request is not None and request.resident and (self.host_histories or all(
            self._decidable(level, p.template) for level, p in enumerate(request.processor.processors)))  # type: ignore[union-attr,attr-defined]
        self.flags.reset(slot, owner=request if resident else None)
        self.listed.dirty = True
        if not resident:
            return False
        assert request is not None and request.processor is not None
        for level, processor in enumerate(request.processor.processors):
            template = processor.template  # type: ignore[attr-defined]
            key = (level, template.group)
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = template.group(level, self.num_slots + 1, self.device)
                if isinstance(group, WindowDecided):
                    group.from_window = self.token_window and not self.host_histories
            group.assign(slot, template)
        self.requests[slot] = request
        self.stop.set(slot, [-1 if request.stop_token_id is None else request.stop_token_id])
        if request.failed:
            self.mark_failed(slot)
        return True

    def _decidable(self, level: int, template: Any) -> bool:
        """Whether ``template``'s group runs it here without host histories."""
        kind: type[Group] = template.group
        return kind.runs_without_histories(template, self.groups.get((level, kind)), token_window=self.token_window)

    def _detach(self, slot: int) -> None:
        """Take ``slot`` out of every group (its request's program stops running)."""
        for group in self.groups.values():
            group.assign(slot, None)

    def _set_failed(self, slot: int, failed: bool) -> None:
        if failed == (slot in self.failed):
            return
        if failed:
            self.failed.add(slot)
        else:
            self.failed.discard(slot)
        self.failed_member.set(slot, [int(failed)])
        self.listed.dirty = True

    def flush(self) -> None:
        """Copy what ``assign`` staged to the device (once per batch change)."""
        self._stop_newly_failed()
        changed = self.stop.flush() | self.failed_member.flush()
        for group in self.groups.values():
            changed = group.flush() or changed
        if changed:
            self.listed.dirty = True

    def mark_failed(self, slot: int) -> None:
        """From the next step on, ``slot``'s program no longer runs and its rows are fail-stopped
        (left alone when its request has no stop token: see ``dynlogits.sdk.guard``)."""
        request = self.requests[slot]
        if request is None:
            return
        self._detach(slot)
        self.listed.dirty = True
        if request.stop_token_id is not None:
            self._set_failed(slot, True)

    # -- layouts ----------------------------------------------------------------------------------
    def set_rows(self, host_slots: np.ndarray) -> None:
        """Row ``r`` of the coming steps' logits holds slot ``host_slots[r]`` (-1: no resident request)."""
        self.listed.set_rows(host_slots)

    def rows_on_device(self, slot_of_row: torch.Tensor, slots_in_step: np.ndarray) -> None:
        """The gathered layout for the coming step: row ``r`` holds slot ``slot_of_row[r]`` (device);
        ``slots_in_step`` (host) are the slots with rows in it."""
        self.flush()
        self.gathered = GatheredLayout(self, slot_of_row.long(), set(np.asarray(slots_in_step).tolist()))

    def use_listed_layout(self) -> None:
        """Back to the listed layout (after ``rows_on_device``)."""
        self.gathered = None

    @property
    def needs_positions(self) -> bool:
        """Whether any group in use needs positions (so an adapter may skip computing them)."""
        return any(g.positional and g.members for g in self.groups.values())

    def group_order(self) -> list[Group]:
        """Every group in entry order (a request's entries apply in the order it gave them)."""
        if len(self._ordered) != len(self.groups):
            self._ordered = [self.groups[key] for key in sorted(self.groups, key=lambda k: k[0])]
        return self._ordered

    def masking_after(self, level: int) -> set[int]:
        """Slots with a group after entry ``level`` that can write ``-inf``."""
        return {slot for (lvl, _), group in self.groups.items() if lvl > level and group.writes_neg_inf
                for slot in group.members}

    # -- one step ---------------------------------------------------------------------------------
    def apply(self, logits: torch.Tensor, engine: EngineStep = NO_INPUT) -> None:
        """Apply every resident request's entries to its row(s) of ``logits`` (in place), with what
        the engine gives this step (``engine``: positions, histories, device deciders; see
        ``EngineStep``). Decided groups are decided on the host from ``engine.histories`` where
        given, else on the device (``engine.window``, ``engine.thinking``).

        Raises:
            ValueError: ``logits`` not contiguous or not ``[rows, vocab_size]``; a decided group
            with neither histories nor a device decider."""
        self._stop_newly_failed()
        if not logits.is_contiguous():
            raise ValueError("the resident path needs contiguous logits")
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:  # flat indices would spill into the next row
            raise ValueError(f"logits of shape {tuple(logits.shape)}; the resident path was built for width {self.vocab_size}")
        if self.gathered is not None:
            step, deaths = self.gathered.step(logits, engine)
        else:
            ran = self.listed.step(logits, engine)
            if ran is None:
                return
            step, deaths = ran
        if deaths:
            self._record_dead(step, deaths, engine.real_rows)
            self._flags_written = True
        if self._flags_written:  # read back in a copy queued now, in the step that wrote them
            self._flags_written = False
            snapshot = self.flags.snapshot()
            INBOX.when_landed(snapshot.landed, lambda: self._read_flags(snapshot), self.device)

    def step_inputs(self, logits: torch.Tensor, generated: torch.Tensor | None, *, drafts: bool,
                    pos: torch.Tensor | None = None, pos_offset: torch.Tensor | None = None) -> StepInputs:
        """What one step gives every group (``drafts``: rows may be drafts, so groups leave the flags
        to ``_record_dead``)."""
        stops = self._stops
        if stops is None or stops[0] is not self.stop.dev:  # a view kept while the table stays
            stops = self._stops = (self.stop.dev, self.stop.dev[:, 0])
        return StepInputs(logits, logits.view(-1), logits.stride(0), generated, stops[1],
                          flags=None if drafts else self.flags.dev, pos=pos, pos_offset=pos_offset)

    def decide_on_host(self, group: DecidedGroup, rows: ListedRows, histories: Sequence[Sequence[int]],
                       failed_rows: list[int]) -> Any:
        """A decided group's decisions for its member rows (``Group.decide_rows``: by default from each
        row's host processor, ``Group.host_decision``); a row whose decision raises fails its request
        alone (its row appended to ``failed_rows``)."""
        deciders = rows.deciders
        if deciders is None:  # once per layout: the rows' processors are fixed until it changes
            level = group.level
            deciders = rows.deciders = [(row, slot, self._processor(slot, level))
                                        for row, slot in zip(rows.rows.tolist(), rows.slots.tolist())]

        def fail(row: int, slot: int, exc: Exception) -> None:
            request = self.requests[slot]
            assert request is not None
            request.fail_with(exc, histories[row])
            self.mark_failed(slot)
            failed_rows.append(row)

        return group.decide_rows(deciders, histories, fail)

    def decide_slots_on_host(self, group: DecidedGroup, slots: Sequence[int]) -> np.ndarray:
        """A decided group that reads no history (``modes.ClockDecided``): each of ``slots``'s
        decision (``-1``: none) from its processor with an empty history; a processor that raises
        fails its request alone (fail-stopped from the next step on)."""
        made = np.full(len(slots), -1, dtype=np.int64)
        for i, slot in enumerate(slots):
            try:
                made[i] = group.host_decision(self._processor(slot, group.level), ())
            except Exception as exc:  # a bug must not escape the sampler: fail this request alone
                request = self.requests[slot]
                assert request is not None
                request.fail_with(exc, ())
                self.mark_failed(slot)
        return made

    def _processor(self, slot: int, level: int) -> Any:
        request = self.requests[slot]
        assert request is not None and request.processor is not None
        return request.processor.processors[level]

    def _record_dead(self, step: StepInputs, deaths: list[Dead], real_rows: torch.Tensor | None) -> None:
        """Fail-stop the rows left with no token (after every group, as the host path does) and flag
        their slots; rows after drafts (``real_rows`` false) only stop: the draft may be rejected."""
        for d in deaths:
            if d.flagged:
                continue  # settled and flagged by its group
            dead = d.evaluate(step)
            if d.settled is not None:
                pass  # fail-stopped by its group already
            elif d.rows is not None:
                assert d.stop_index is not None
                at_stop = step.flat.index_select(0, d.stop_index)
                stopping = dead if d.can_stop is None else dead & d.can_stop
                step.flat.index_copy_(0, d.stop_index, at_stop.masked_fill_(stopping, 0.0))
            else:
                stops = step.stops[d.slots]
                index = stops.clamp(min=0)[:, None]
                at_stop = step.logits.gather(1, index)
                step.logits.scatter_(1, index, at_stop.masked_fill_((dead & (stops >= 0))[:, None], 0.0))
            flagged = dead if real_rows is None else dead & (real_rows if d.rows is None else real_rows[d.rows])
            position = d.positions if d.positions is not None else torch.zeros_like(d.slots)
            self.flags.dev.scatter_reduce_(0, d.slots, torch.where(flagged, position, self._minus_one), reduce="amax")

    # -- failures read back -----------------------------------------------------------------------
    def _read_flags(self, snapshot: FlagSnapshot) -> None:
        """Fail the requests a landed snapshot flags (any thread: see ``dynlogits.sdk.readback``);
        their slots are fail-stopped at the next ``apply``/``flush`` (``_stop_newly_failed``)."""
        try:
            values = snapshot.values[: self.num_slots]  # not the sentinel's
            if values.tobytes() == self._no_flags:  # nothing flagged (a byte compare: cheaper than numpy)
                return
            for slot in np.flatnonzero(values >= 0).tolist():
                request = snapshot.owners[slot]
                if request is None or request.error is not None:
                    continue  # (a failed request without a stop token stays flagged: already handled)
                request.fail(NO_TOKEN_LEFT.format(n=int(values[slot])))
                self._newly_failed.append(request)
        finally:
            snapshot.release()

    def _stop_newly_failed(self) -> None:
        """Fail-stop the slots now held by requests a landed snapshot failed (the request may have
        left its slot since, or been preempted and re-added to another)."""
        while self._newly_failed:
            request = self._newly_failed.popleft()
            for slot, held in enumerate(self.requests):
                if held is request:
                    self.mark_failed(slot)

    def held(self) -> int:
        """How many slots hold a resident request."""
        return sum(r is not None for r in self.requests)

    def __repr__(self) -> str:
        return f"SlotBatch(slots={self.num_slots}, held={self.held()}, groups={len(self.groups)})"


class ListedLayout:
    """The host knows which slot each logits row holds (``set_rows``): member rows, their flat
    indices and each group's cached tables are built once per batch change (``prepare``: one
    non-blocking upload of every group's rows), and a step reuses them."""

    def __init__(self, batch: SlotBatch) -> None:
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

    def set_rows(self, host_slots: np.ndarray) -> None:
        self.host_slots = np.asarray(host_slots, dtype=np.int64)
        self.dirty = True

    def _rows(self, rows: np.ndarray, stride: int, rows_dev: torch.Tensor, slots_dev: torch.Tensor) -> ListedRows:
        batch, host = self.batch, self.host_slots
        assert host is not None
        slots = host[rows]
        stops = batch.stop.dev[slots_dev, 0]
        base = rows_dev * stride
        every_stops = all(batch.requests[s] is not None and batch.requests[s].stop_token_id is not None  # type: ignore[union-attr]
                          for s in slots.tolist())
        identity = bool(np.array_equal(rows, np.arange(len(host))))
        return ListedRows(rows, slots, rows_dev, slots_dev, row_runs(rows.tolist()), stop_index=base + stops.clamp(min=0),
                          can_stop=None if every_stops else stops >= 0, base=base, identity=identity)

    def prepare(self, stride: int, dtype: torch.dtype) -> None:
        """Member rows (and each group's cached indices) for the current rows: the host arrays of
        every group go to the device in one non-blocking upload."""
        batch, host = self.batch, self.host_slots
        assert host is not None
        in_step = host >= 0
        members = [(key, np.flatnonzero(in_step & np.isin(host, list(group.members))))
                   for key, group in batch.groups.items() if group.members]
        members = [(key, rows) for key, rows in members if len(rows)]
        failed = np.flatnonzero(in_step & np.isin(host, list(batch.failed))) if batch.failed else np.empty(0, np.int64)
        parts = [np.where(in_step, host, batch.sentinel)]
        for _, rows in [*members, (None, failed)]:
            parts += [rows, host[rows]]
        packed = np.concatenate(parts).astype(np.int64, copy=False)
        self._layout.buffer(len(packed))[:] = packed
        views = iter(self._layout.upload(len(packed), keep=True).split([len(p) for p in parts]))
        self.slot_of_row = next(views)
        self.rows = {}
        for key, rows in members:
            listed = self.rows[key] = self._rows(rows, stride, next(views), next(views))
            listed.last = not (batch.groups[key].members & batch.masking_after(key[0]))
            batch.groups[key].prepare(listed, stride)
        self.failed = self._rows(failed, stride, next(views), next(views)) if len(failed) else None
        self.steps = [(batch.groups[key], self.rows[key]) for key in sorted(self.rows, key=lambda k: k[0])]
        self.positions_needed = any(group.positional for group, _ in self.steps)
        self.generated_needed = any(group.reads_generated(rows) for group, rows in self.steps)
        self._plan_step_values(len(host))
        self.stride, self.dtype = stride, dtype
        self.dirty = False

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
        (``Group.plan``), in one non-blocking upload; the row-indexed counts on the device (``None``
        when no group reads them)."""
        assert self.host_slots is not None
        n = len(self.host_slots)
        if len(histories) != n:
            raise ValueError(f"{len(histories)} histories for a layout of {n} rows")
        buf = self.step_values.host()
        counts = [len(h) for h in histories]
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
        if histories is not None or isinstance(group, ClockDecided):
            decisions = self.batch.decide_on_host(group, rows, histories if histories is not None else NO_HISTORIES,
                                                  self.failed_now)
            return group.apply_host_decisions(step, rows, decisions, self._decisions)
        assert self.slot_of_row is not None
        return decide_on_device(group, step, group.every_row(self.slot_of_row), engine.thinking, engine.window)

    def _fail_stop(self, step: StepInputs, rows: ListedRows) -> None:
        """Rows of failed requests: only their stop token (a deliberate override of every mask)."""
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        stops = self.batch.stop.dev[rows.slots_dev, 0]
        step.flat.index_fill_(0, rows.rows_dev * step.stride + stops, 0.0)


def decide_on_device(group: DecidedGroup, step: StepInputs, rows: GatheredRows, thinking: ThinkingDecider | None,
                     window: TokenWindow | None) -> Dead | None:
    """A decided group's step on the device: from ``window`` where the group reads it
    (``modes.WindowDecided``), else by the ``thinking`` decider."""
    if window is not None and isinstance(group, WindowDecided):
        decided = group.decide_from_window(rows, window)
    elif thinking is not None:
        decided = thinking(group, rows)
    else:
        raise ValueError(f"{type(group).__name__} needs the rows' histories or a device decider")
    return group.apply_device_decisions(step, rows, decided)


class GatheredLayout:
    """Only the device knows which slot each row holds (``slot_of_row``, one step): every row
    gathers its slot's tables and a membership mask makes non-member rows' writes no-ops."""

    def __init__(self, batch: SlotBatch, slot_of_row: torch.Tensor, slots_in_step: set[int]) -> None:
        self.batch = batch
        self.slot_of_row = slot_of_row
        self.slots_in_step = slots_in_step

    def step(self, logits: torch.Tensor, engine: EngineStep) -> tuple[StepInputs, list[Dead]]:
        """One step (``SlotBatch.apply``)."""
        generated, pos, pos_offset = engine.generated, engine.pos, engine.pos_offset
        batch = self.batch
        if pos is not None and generated is None:
            assert pos_offset is not None
            generated = pos - pos_offset
        step = batch.step_inputs(logits, generated, drafts=engine.real_rows is not None, pos_offset=pos_offset)
        deaths = []
        for group in batch.group_order():
            if not (group.members & self.slots_in_step):
                continue
            rows = GatheredRows(self.slot_of_row, group.member.dev[self.slot_of_row, 0])
            if isinstance(group, ClockDecided):
                dead = self._decided_per_slot(group, step, rows)
            elif isinstance(group, DecidedGroup):
                dead = decide_on_device(group, step, rows, engine.thinking, engine.window)
            else:
                dead = group.apply_gathered(step, rows)
            if dead is not None:
                deaths.append(dead)
        if batch.failed & self.slots_in_step:
            self._fail_stop(step)
        return step, deaths

    def _decided_per_slot(self, group: DecidedGroup, step: StepInputs, rows: GatheredRows) -> Dead | None:
        """A decided group that reads no history: decided on the host per member slot of the step
        (``SlotBatch.decide_slots_on_host``); nothing runs on the device unless one forces, then its
        tokens by slot go up in one upload and are gathered per row."""
        batch = self.batch
        slots = sorted(group.members & self.slots_in_step)
        tokens = batch.decide_slots_on_host(group, slots)
        if not (tokens >= 0).any():
            return None
        by_slot = batch.slot_decisions.buffer(batch.num_slots + 1)
        by_slot[:] = -1
        by_slot[slots] = tokens
        per_row = batch.slot_decisions.upload(batch.num_slots + 1)[self.slot_of_row]
        return group.apply_device_decisions(step, rows, per_row)

    def _fail_stop(self, step: StepInputs) -> None:
        """Rows of failed requests: only their stop token (a deliberate override of every mask)."""
        batch = self.batch
        where = batch.failed_member.dev[self.slot_of_row, 0]
        step.logits.masked_fill_(where[:, None], NEG_INF)
        stops = batch.stop.dev[self.slot_of_row, 0].clamp(min=0)[:, None]
        step.logits.scatter_(1, stops, torch.where(where[:, None], torch.zeros_like(stops, dtype=step.logits.dtype),
                                                   step.logits.gather(1, stops)))
