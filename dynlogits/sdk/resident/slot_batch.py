"""The resident apply path: built-in processors kept on the device, per persistent request slot.

``SlotBatch`` holds the slots' occupancy: it compiles each resident request
(``GuardedRequest.resident``) into per-slot device tables when it enters a slot, one group per
entry position and kind (each kind's ``Group`` and its mode, ``dynlogits.processors.slots`` and
``modes``); it knows kinds only through their groups. A step is a few tensor ops per group, run by
the layout in use: ``listed.ListedLayout`` (the host knows each row's slot) or
``gathered.GatheredLayout`` (only the device does); decided groups are decided by ``deciding``;
failed slots, the failure flags and their read back are ``failures.Failures``; what the engine
gives a step is one ``engine_step.EngineStep``. Steady steps read nothing back and build no tensor
from a host list.

Lifecycle: ``assign(slot, request)`` as requests enter (``None`` clears), ``flush()`` once per batch
change; ``set_rows(host_slots)`` or, each step, ``rows_on_device(slot_of_row, slots)``;
``apply(logits, EngineStep(...))``. Made on a CUDA device, it first probes every kind's fused
kernels (``warm``), so no request's step compiles them.

Assumptions (the adapter's side):

* slots are the engine's persistent indices in ``[0, num_slots)``, reused only after ``assign``;
* ``flush()`` runs after a batch change's ``assign`` calls and before the next ``apply``;
* ``logits`` is ``[rows, vocab_size]`` on ``device``, each row in the slot last named for it;
* ``EngineStep.generated`` counts the tokens a row's request generated before that row, drafts included.

Guarantees:

* a slot's program is exactly its last assigned request's;
* rows of slots with no resident request are never written;
* ``apply`` never raises for one request's data and never undoes an engine's ``-inf``, except to
  fail-stop a failed request to its stop token;
* a failure touches only that request's rows: a row left with no token is fail-stopped on the
  device in the same step, and its request (the slot's occupant when the flags' copy was queued) is
  failed once the copy lands (``readback``); a draft row (``EngineStep.real_rows`` false) stops that row only."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dynlogits.processors.modes import WindowDecided
from dynlogits.processors.slots import Group, SlotTable, StepInputs
from dynlogits.processors.uploads import StepUpload

from ..guard import GuardedRequest
from .engine_step import NO_INPUT, EngineStep
from .failures import Failures
from .gathered import GatheredLayout
from .listed import ListedLayout
from .warm import warm

__all__ = ["GatheredLayout", "ListedLayout", "SlotBatch"]


class SlotBatch:
    """Per-slot device programs of an engine's resident requests (see the module doc)."""

    def __init__(self, *, num_slots: int, vocab_size: int, device: torch.device | str, host_histories: bool = False,
                 token_window: bool = False) -> None:
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        warm(self.device, vocab_size)  # on CUDA: every kind's fused kernels (and this width's) ready now, not in a step
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
        #: failed slots, the device's failure flags and their read back
        self.failures = Failures(num_slots, self.device)
        self._ordered: list[Group] = []  # ``groups`` in entry order (``group_order``)
        self.slot_decisions = StepUpload(torch.long, self.device)  # per-slot host decisions, gathered layouts
        self.listed = ListedLayout(self)
        self.gathered: GatheredLayout | None = None  # set for a step by ``rows_on_device``
        self._needs_positions: bool | None = None  # ``needs_positions``, until a group's members change

    # -- batch changes ----------------------------------------------------------------------------
    def assign(self, slot: int, request: GuardedRequest | None) -> bool:
        """Put ``request``'s program in ``slot`` (``None``, or a request that is not resident here,
        clears it); returns whether the slot now holds a resident request. A request that has
        already failed with a stop token (refused at realization) is held whatever its entries: its
        rows get only that token, on the device."""
        self._detach(slot)
        self._set_failed(slot, False)
        self.requests[slot] = None
        stopped = request is not None and request.failed and request.stop_token_id is not None
        resident = stopped or (request is not None and request.resident and request.processor is not None and (
            self.host_histories
            or all(self._decidable(level, p.template)  # type: ignore[attr-defined]  # a resident request's processors have one
                   for level, p in enumerate(request.processor.processors))))
        self.failures.flags.reset(slot, owner=request if resident else None)
        self.listed.dirty = True
        if not resident:
            return False
        assert request is not None
        for level, processor in enumerate(request.processor.processors if request.processor is not None and not stopped else ()):
            template = processor.template  # type: ignore[attr-defined]  # a resident request's processors have one
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
        self._needs_positions = None  # every change of members starts here (``assign``, ``mark_failed``)

    def _set_failed(self, slot: int, failed: bool) -> None:
        if self.failures.set_failed(slot, failed):
            self.listed.dirty = True

    def flush(self) -> None:
        """Copy what ``assign`` staged to the device (once per batch change)."""
        self._stop_newly_failed()
        changed = self.stop.flush() | self.failures.failed_member.flush()
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
        """Whether any group in use needs positions (so an adapter may skip computing them); kept
        until a group's members change (``assign``, ``mark_failed``)."""
        needs = self._needs_positions
        if needs is None:
            needs = self._needs_positions = any(g.positional and g.members for g in self.groups.values())
        return needs

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
            self.failures.record_dead(step, deaths, engine.real_rows)
        self.failures.queue_read_back()  # in the step that wrote them

    def step_inputs(self, logits: torch.Tensor, generated: torch.Tensor | None, *, drafts: bool,
                    pos: torch.Tensor | None = None, pos_offset: torch.Tensor | None = None,
                    real_rows: torch.Tensor | None = None) -> StepInputs:
        """What one step gives every group (``drafts``: rows may be drafts, so groups leave the flags
        to ``Failures.record_dead``, but for one that flags ``real_rows`` alone: ``flag_real_rows``)."""
        stops = self._stops
        if stops is None or stops[0] is not self.stop.dev:  # a view kept while the table stays
            stops = self._stops = (self.stop.dev, self.stop.dev[:, 0])
        flag_rows = self.failures.flag_rows
        return StepInputs(logits, logits.view(-1), logits.stride(0), generated, stops[1],
                          flag_rows=None if drafts else flag_rows, pos=pos, pos_offset=pos_offset,
                          real_rows=real_rows if drafts else None,
                          flag_real_rows=flag_rows if drafts and real_rows is not None else None)

    def _stop_newly_failed(self) -> None:
        """Fail-stop the slots now held by requests a landed snapshot failed (the request may have
        left its slot since, or been preempted and re-added to another)."""
        newly_failed = self.failures.newly_failed
        while newly_failed:
            request = newly_failed.popleft()
            for slot, held in enumerate(self.requests):
                if held is request:
                    self.mark_failed(slot)

    def held(self) -> int:
        """How many slots hold a resident request."""
        return sum(r is not None for r in self.requests)

    def __repr__(self) -> str:
        return f"SlotBatch(slots={self.num_slots}, held={self.held()}, groups={len(self.groups)})"
