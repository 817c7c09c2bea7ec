"""The resident apply path: built-in processors kept on the device, per persistent request slot.

Engines such as vLLM keep requests in persistent *slots* and hand the sampler a batch whose layout
changes only when requests come and go. ``SlotBatch`` compiles each resident request (every
processor a built-in kind: ``GuardedRequest.resident``) into per-slot device tables once, when it
enters a slot, and runs each step as a few tensor ops per group of entries
(``dynlogits.sdk.resident.slot_groups``), reading positions from what the engine already has. In steady
state the host's work per row is reading the V1 runner's history lengths and, for its forced rows,
picking each row's token (``Group.plan``: a Python loop for a few rows, one numpy pass for more);
nothing is read back from the device, and no tensor is built from a host list: the only traffic is what
``dynlogits.sdk.resident.staging`` queues without blocking (the V1 runner's positions and planned
forced ids, host-decided ``thinking_budget`` tokens, failure flags).

Lifecycle (what an adapter calls):

* ``assign(slot, request)`` when a request enters a slot (``None`` clears it), then ``flush()``
  once per batch change (vLLM V2: ``apply_staged_writes``);
* ``set_rows(host_slots)`` when the host knows which slot each logits row holds (the V1 runner;
  Model Runner V2 without speculative decoding), or ``rows_on_device(slot_of_row, slots)`` each
  step when only the device knows (Model Runner V2 with speculative decoding);
* ``apply(logits, ...)`` every step.

Assumptions (what the adapter guarantees):

* slots are the engine's own persistent indices in ``[0, num_slots)``; a slot is reused only
  after ``assign`` gave it its new occupant (or ``None``);
* ``flush()`` runs after the ``assign`` calls of a batch change and before the next ``apply``;
* ``logits`` is ``[rows, vocab_size]``, on ``device``, and each row belongs to the slot the last
  ``set_rows`` / ``rows_on_device`` named for it;
* positions passed to ``apply`` (``generated``) count the tokens a row's request generated before
  that row, drafts included.

Guarantees (what ``SlotBatch`` gives back):

* a slot's program is exactly the request it was last assigned: nothing of a former occupant
  survives ``assign``;
* rows of slots with no resident request are never written;
* ``apply`` never raises for one request's data (ids were checked against ``vocab_size`` at
  realization) and never undoes a ``-inf`` the engine wrote, except to fail-stop a failed
  request to its stop token (the one deliberate override: a failed request must end);
* a failure touches only the failed request's own rows.

Failures: a row left with no token (a forced or allowed token masked by the engine's grammar, or
by the request's own entries) is fail-stopped on the device in the same step and its slot's flag
written; a copy of the flags queued in that same step is read once it lands
(``dynlogits.sdk.readback``: at the adapter's next call, or by the watcher thread), and the request
it names (the slot's occupant when the copy was queued, even if it has left since) is then failed
(``GuardedRequest.fail``) and fail-stopped in whatever slot it holds from the next step on.
Requests failed on the host are fail-stopped the same way.
Failing rows on draft positions (``real_rows`` false) stop only that row: the draft may be rejected.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dynlogits.processors.templates import BiasTemplate

from ..guard import NO_TOKEN_LEFT, GuardedRequest
from ..plans import fill_rows, row_runs
from ..readback import INBOX
from .slot_groups import GROUP_TYPES, Dead, Group, KnownRows, MaskedRows, StepInputs, ThinkingGroup
from dynlogits.uploads import StepUpload, StepValues

from .staging import FlagSnapshot, SlotFlags, SlotTable

__all__ = ["SlotBatch", "ThinkingDecider"]

logger = logging.getLogger("dynlogits.sdk")

NEG_INF = -math.inf

#: Device decisions for a ``thinking_budget`` group in the masked layout: ``(group, rows) -> tokens``
#: (the end token to force per row, -1 for none).
ThinkingDecider = Callable[[ThinkingGroup, MaskedRows], torch.Tensor]


class SlotBatch:
    """Per-slot device programs of an engine's resident requests (see the module doc)."""

    def __init__(self, *, num_slots: int, vocab_size: int, device: torch.device | str) -> None:
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.requests: list[GuardedRequest | None] = [None] * num_slots
        self.groups: dict[tuple[int, type], Group] = {}
        # Tables have one more row than there are slots: the sentinel ``num_slots``, never
        # assigned, stands for rows that hold no resident request.
        self._sentinel = num_slots
        self._stop = SlotTable(num_slots + 1, torch.long, self.device, pad=-1)
        self._failed: set[int] = set()  # slots whose request failed: fail-stopped every step
        self._failed_member = SlotTable(num_slots + 1, torch.bool, self.device, pad=0)
        self._flags = SlotFlags(num_slots + 1, self.device)  # output position a slot's row was left empty, or -1
        self._no_flags = np.full(num_slots, self._flags.fill, dtype=np.int64).tobytes()  # the slots' values, none flagged
        #: the known layout's per-step values from the host: each row's generated count, then what
        #: the groups plan (``_planners``); one device tensor for the layout's life
        self._step_values = StepValues(torch.long, self.device)
        self._decisions = StepUpload(torch.long, self.device)
        self._layout = StepUpload(torch.long, self.device)  # a known layout's rows and slots
        self._minus_one = torch.full((), -1, dtype=torch.long, device=self.device)
        self._host_slots: np.ndarray | None = None
        self._known: dict[tuple[int, type], KnownRows] = {}
        self._known_failed: KnownRows | None = None
        self._stride: int | None = None
        self._dtype: torch.dtype | None = None
        self._layout_dirty = True
        self._failed_now: list[int] = []
        self._flags_written = False  # flags written since the last snapshot was queued
        #: requests a landed snapshot failed (possibly on the watcher thread), to fail-stop in their
        #: current slot at this instance's next ``apply``/``flush``
        self._newly_failed: deque[GuardedRequest] = deque()
        self._stops = self._stop.dev[:, 0]
        self._ordered: list[Group] = []  # ``groups`` in entry order (see ``_group_order``)
        self._known_steps: list[tuple[Group, KnownRows]] = []  # the known layout's groups in entry order
        #: the known layout's groups whose host plans a step (``Group.plan``), with where their values
        #: go in the step's upload (after the rows' positions)
        self._planners: list[tuple[Group, KnownRows, int, int, torch.Tensor]] = []
        self._generated_view: torch.Tensor | None = None  # ``_step_values``' counts, when a group reads them
        self._positions_needed = False  # a group of the known layout is positional
        self._generated_needed = False  # a group of the known layout reads ``StepInputs.generated``

    # -- batch changes ----------------------------------------------------------------------------
    def assign(self, slot: int, request: GuardedRequest | None) -> bool:
        """Put ``request``'s program in ``slot`` (``None``, or a request that is not resident, clears
        it); returns whether the slot now holds a resident request."""
        self._detach(slot)
        self._set_failed(slot, False)
        self.requests[slot] = None
        resident = request is not None and request.resident
        self._flags.reset(slot, owner=request if resident else None)
        self._layout_dirty = True
        if not resident:
            return False
        for level, processor in enumerate(request.processor.processors):  # type: ignore[union-attr]
            template = processor.template
            key = (level, type(template))
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = GROUP_TYPES[type(template)](level, self.num_slots + 1, self.device)
            group.assign(slot, template)
        self.requests[slot] = request
        self._stop.set(slot, [-1 if request.stop_token_id is None else request.stop_token_id])
        if request.failed:
            self.mark_failed(slot)
        return True

    def _detach(self, slot: int) -> None:
        """Take ``slot`` out of every group (its request's program stops running)."""
        for group in self.groups.values():
            group.assign(slot, None)

    def _set_failed(self, slot: int, failed: bool) -> None:
        if failed == (slot in self._failed):
            return
        if failed:
            self._failed.add(slot)
        else:
            self._failed.discard(slot)
        self._failed_member.set(slot, [int(failed)])
        self._layout_dirty = True

    def flush(self) -> None:
        """Copy what ``assign`` staged to the device (once per batch change)."""
        self._stop_newly_failed()
        changed = self._stop.flush() | self._failed_member.flush()
        self._stops = self._stop.dev[:, 0]
        for group in self.groups.values():
            changed = group.flush() or changed
        if changed:
            self._layout_dirty = True

    # -- layouts ----------------------------------------------------------------------------------
    def set_rows(self, host_slots: np.ndarray) -> None:
        """Row ``r`` of the coming steps' logits holds slot ``host_slots[r]`` (-1: no resident request)."""
        self._host_slots = np.asarray(host_slots, dtype=np.int64)
        self._layout_dirty = True

    def _known_rows(self, rows: np.ndarray, stride: int, rows_dev: torch.Tensor, slots_dev: torch.Tensor) -> KnownRows:
        slots = self._host_slots[rows]  # type: ignore[index]
        stops = self._stop.dev[slots_dev, 0]
        base = rows_dev * stride
        every_stops = all(self.requests[s] is not None and self.requests[s].stop_token_id is not None  # type: ignore[union-attr]
                          for s in slots.tolist())
        identity = bool(np.array_equal(rows, np.arange(len(self._host_slots))))  # type: ignore[arg-type]
        return KnownRows(rows, slots, rows_dev, slots_dev, row_runs(rows.tolist()), stop_index=base + stops.clamp(min=0),
                         can_stop=None if every_stops else stops >= 0, base=base, identity=identity)

    def _prepare(self, stride: int, dtype: torch.dtype) -> None:
        """Member rows (and each group's cached indices) for the current known layout: the host
        arrays of every group go to the device in one non-blocking upload."""
        host = self._host_slots
        assert host is not None
        self._known.clear()
        in_step = host >= 0
        members = [(key, np.flatnonzero(in_step & np.isin(host, list(group.members))))
                   for key, group in self.groups.items() if group.members]
        members = [(key, rows) for key, rows in members if len(rows)]
        failed = np.flatnonzero(in_step & np.isin(host, list(self._failed))) if self._failed else np.empty(0, np.int64)
        parts = [np.where(in_step, host, self._sentinel)]
        for _, rows in [*members, (None, failed)]:
            parts += [rows, host[rows]]
        packed = np.concatenate(parts).astype(np.int64, copy=False)
        self._layout.buffer(len(packed))[:] = packed
        dev = self._layout.upload(len(packed), keep=True)
        self._slot_of_row = dev[: len(host)]
        at = len(host)

        def take(n: int) -> torch.Tensor:
            nonlocal at
            at += n
            return dev[at - n : at]

        for key, rows in members:
            known = self._known[key] = self._known_rows(rows, stride, take(len(rows)), take(len(rows)))
            known.last = not (self.groups[key].members & self._masked_later(key[0]))
            self.groups[key].prepare(known, stride)
        self._known_failed = self._known_rows(failed, stride, take(len(failed)), take(len(failed))) if len(failed) else None
        self._known_steps = [(self.groups[key], self._known[key]) for key in sorted(self._known, key=lambda k: k[0])]
        self._positions_needed = any(self.groups[key].positional for key in self._known)
        self._generated_needed = any(group.reads_generated(rows) for group, rows in self._known_steps)
        self._plan_step_values(len(host))
        self._stride, self._dtype = stride, dtype
        self._layout_dirty = False

    def _plan_step_values(self, n: int) -> None:
        """Lay out ``_step_values`` for this layout: ``n`` generated counts, then each planning
        group's values; the views the steps read are taken here, once."""
        self._planners = []
        if not self._positions_needed:
            self._generated_view = None
            return
        spans, size = [], n
        for group, rows in self._known_steps:
            if group.planned_per_row:
                spans.append((group, rows, size, size + group.planned_per_row * len(rows.rows)))
                size = spans[-1][3]
        dev = self._step_values.resize(size)
        self._generated_view = dev[:n] if self._generated_needed else None
        self._planners = [(group, rows, start, stop, dev[start:stop].view(group.planned_per_row, -1))
                          for group, rows, start, stop in spans]

    def _masked_later(self, level: int) -> set[int]:
        """Slots with a group after entry ``level`` that can write ``-inf`` (anything but a bias)."""
        return {slot for (lvl, kind), group in self.groups.items() if lvl > level and kind is not BiasTemplate
                for slot in group.members}

    @property
    def needs_positions(self) -> bool:
        """Whether any group in use needs positions (so an adapter may skip computing them)."""
        return any(g.positional and g.members for g in self.groups.values())

    # -- one step ---------------------------------------------------------------------------------
    def apply(
        self,
        logits: torch.Tensor,
        *,
        histories: Sequence[Sequence[int]] | None = None,
        generated: torch.Tensor | None = None,
        thinking: ThinkingDecider | None = None,
        real_rows: torch.Tensor | None = None,
        pos: torch.Tensor | None = None,
        pos_offset: torch.Tensor | None = None,
    ) -> None:
        """Apply every resident request's entries to its row(s) of ``logits`` (in place).

        Positions come from ``histories`` (known layout: the history of each row, host lists whose
        lengths are uploaded), ``generated`` (a row-indexed device tensor of generated counts), or
        ``pos`` and ``pos_offset`` (row-indexed device tensors, ``generated = pos - pos_offset``;
        ``pos_offset`` must be the same tensor for as long as the layout stays): groups that can
        read ``pos`` directly do, and the subtraction runs only when another group needs it.
        ``thinking`` decides ``thinking_budget`` groups on the device (masked layout, or whenever
        ``histories`` is absent); otherwise they are decided on the host from ``histories``.
        ``real_rows`` (masked layout) marks the rows whose history is committed, i.e. not drafts.
        """
        self._stop_newly_failed()
        if not logits.is_contiguous():
            raise ValueError("the resident path needs contiguous logits")
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:  # flat indices would spill into the next row
            raise ValueError(f"logits of shape {tuple(logits.shape)}; the resident path was built for width {self.vocab_size}")
        masked = self._masked
        stride = logits.stride(0)
        if masked is None:
            if self._host_slots is None:
                return
            if self._layout_dirty or self._stride != stride or self._dtype != logits.dtype:
                self.flush()
                self._prepare(stride, logits.dtype)
            if generated is None and histories is not None and self._positions_needed:
                generated = self._upload_positions(histories)
            else:
                for _, rows, _, _, _ in self._planners:
                    rows.planned = None
        if pos is not None and generated is None and (masked is not None or self._generated_needed):
            assert pos_offset is not None
            generated = pos - pos_offset
        step = StepInputs(logits, logits.view(-1), stride, generated, self._stops,
                          flags=self._flags.dev if real_rows is None else None,
                          pos=pos if masked is None else None, pos_offset=pos_offset)
        deaths: list[Dead] = []
        if masked is None:
            for group, rows in self._known_steps:
                dead = (self._apply_thinking_known(group, step, rows, histories, thinking)
                        if isinstance(group, ThinkingGroup) else group.apply_known(step, rows))
                if dead is not None:
                    deaths.append(dead)
        else:
            for group in self._group_order():
                dead = self._apply_masked_group(group, step, masked, thinking)
                if dead is not None:
                    deaths.append(dead)
        if self._failed:
            self._fail_stop_failed(step, masked)
        if self._failed_now:
            for row in self._failed_now:  # failed on the host during this step (known layout)
                request = self.requests[int(self._host_slots[row])]  # type: ignore[index]
                if request is not None:
                    request.force_stop(logits[row])
            self._failed_now.clear()
        if deaths:
            self._record_dead(step, deaths, real_rows)
            self._flags_written = True
        if self._flags_written:  # read back in a copy queued now, in the step that wrote them
            self._flags_written = False
            snapshot = self._flags.snapshot()
            INBOX.when_landed(snapshot.landed, lambda: self._read_flags(snapshot), self.device)

    def _upload_positions(self, histories: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Known layout, positions on the host: every row's generated count and what the groups plan
        from it (``Group.plan``), in one non-blocking upload; the row-indexed counts on the device
        (``None`` when no group of the layout reads them)."""
        values = self._step_values
        assert self._host_slots is not None
        n = len(self._host_slots)
        if len(histories) != n:
            raise ValueError(f"{len(histories)} histories for a layout of {n} rows")
        buf = values.host()
        counts = [len(h) for h in histories]
        buf[:n] = counts
        generated = buf[:n]
        for group, rows, start, stop, planned in self._planners:
            group.plan(rows, counts, generated, buf[start:stop])
            rows.planned = planned
        values.push()
        return self._generated_view

    _masked: MaskedRows | None = None

    def rows_on_device(self, slot_of_row: torch.Tensor, slots_in_step: np.ndarray) -> None:
        """The masked layout for the coming step: row ``r`` holds slot ``slot_of_row[r]`` (device);
        ``slots_in_step`` (host) are the slots with rows in it."""
        self.flush()
        self._masked = MaskedRows(slot_of_row.long(), torch.empty(0, dtype=torch.bool, device=self.device))
        self._slots_in_step = set(np.asarray(slots_in_step).tolist())

    def use_known_layout(self) -> None:
        """Back to the known layout (after ``rows_on_device``)."""
        self._masked = None

    def _group_order(self) -> list[Group]:
        """Every group in entry order (a request's entries apply in the order it gave them)."""
        if len(self._ordered) != len(self.groups):
            self._ordered = [self.groups[key] for key in sorted(self.groups, key=lambda k: k[0])]
        return self._ordered

    def _apply_thinking_known(self, group: ThinkingGroup, step: StepInputs, rows: KnownRows,
                              histories: Sequence[Sequence[int]] | None, thinking: ThinkingDecider | None) -> Dead | None:
        """A ``thinking_budget`` group in the known layout: decided on the host from ``histories``,
        else on the device by ``thinking``."""
        if histories is not None:
            return group.apply_decided(step, rows, self._decide_on_host(group, rows, histories), self._decisions)
        if thinking is None:
            raise ValueError("thinking_budget needs the rows' histories or a device decider")
        every = MaskedRows(self._slot_of_row, group.member.dev[self._slot_of_row, 0])
        return group.apply_device(step, every, thinking(group, every))

    def _apply_masked_group(self, group: Group, step: StepInputs, masked: MaskedRows,
                            thinking: ThinkingDecider | None) -> Dead | None:
        if not (group.members & self._slots_in_step):
            return None
        rows_m = MaskedRows(masked.slot_of_row, group.member.dev[masked.slot_of_row, 0])
        if isinstance(group, ThinkingGroup):
            if thinking is None:
                raise ValueError("thinking_budget in a masked layout needs a device decider")
            return group.apply_device(step, rows_m, thinking(group, rows_m))
        return group.apply_masked(step, rows_m)

    def _decide_on_host(self, group: ThinkingGroup, rows: KnownRows, histories: Sequence[Sequence[int]]) -> np.ndarray:
        decisions = np.full(len(rows.rows), -1, dtype=np.int64)
        for i, (row, slot) in enumerate(zip(rows.rows.tolist(), rows.slots.tolist())):
            request = self.requests[slot]
            assert request is not None and request.processor is not None
            try:
                op = request.processor.processors[group.level].row_op(histories[row])
            except Exception as exc:  # a bug must not escape the sampler: fail this request alone
                request.fail_with(exc, histories[row])
                self.mark_failed(slot)
                self._failed_now.append(row)
                continue
            if op is not None:
                decisions[i] = op.token_id
        return decisions

    def _fail_stop_failed(self, step: StepInputs, masked: MaskedRows | None) -> None:
        """Rows of failed requests: only their stop token (a deliberate override of every mask)."""
        if not self._failed:
            return
        if masked is None:
            rows = self._known_failed
            if rows is None:
                return
            fill_rows(step.logits, rows.runs, rows.rows_dev)
            stops = self._stop.dev[rows.slots_dev, 0]
            step.flat.index_fill_(0, rows.rows_dev * step.stride + stops, 0.0)
            return
        if not (self._failed & self._slots_in_step):
            return
        where = self._failed_member.dev[masked.slot_of_row, 0]
        step.logits.masked_fill_(where[:, None], NEG_INF)
        stops = self._stop.dev[masked.slot_of_row, 0].clamp(min=0)[:, None]
        step.logits.scatter_(1, stops, torch.where(where[:, None], torch.zeros_like(stops, dtype=step.logits.dtype),
                                                   step.logits.gather(1, stops)))

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
            self._flags.dev.scatter_reduce_(0, d.slots, torch.where(flagged, position, self._minus_one), reduce="amax")

    def _read_flags(self, snapshot: FlagSnapshot) -> None:
        """Fail the requests a landed snapshot flags (any thread: see ``dynlogits.sdk.readback``);
        their slots are fail-stopped at the next ``apply``/``flush`` (``_stop_newly_failed``)."""
        try:
            values = snapshot.values[: self.num_slots]  # not the sentinel's
            if values.tobytes() == self._no_flags:  # nothing flagged: a byte compare (a numpy reduction's
                return  # fixed cost is ~10 us with cold caches, as after a forward pass)
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

    def mark_failed(self, slot: int) -> None:
        """From the next step on, ``slot``'s program no longer runs and its rows are fail-stopped
        (left alone when its request has no stop token: see ``dynlogits.sdk.guard``)."""
        request = self.requests[slot]
        if request is None:
            return
        self._detach(slot)
        self._layout_dirty = True
        if request.stop_token_id is not None:
            self._set_failed(slot, True)

    def held(self) -> int:
        """How many slots hold a resident request."""
        return sum(r is not None for r in self.requests)

    def __repr__(self) -> str:
        return f"SlotBatch(slots={self.num_slots}, held={self.held()}, groups={len(self.groups)})"
