"""The gathered layout: only the device knows which slot each row holds (Model Runner V2 with
drafts: one row per draft token, ``slot_of_row`` on the device, one step).

Every row gathers its slot's tables and a membership mask makes non-member rows' writes no-ops;
decided groups are decided on the device (``deciding``), except a clock-decided one, decided on the
host per member slot of the step and uploaded only when one forces.

Guarantees: nothing is read back; rows of slots with no resident request are never written; rows
of failed requests get only their stop token."""

from __future__ import annotations

import math

import torch

from dynlogits.processors.modes import ClockDecided, DecidedGroup
from dynlogits.processors.slots import Dead, GatheredRows, StepInputs

from .batch_view import BatchView
from .deciding import decide_on_device, decide_slots_on_host, in_span
from .engine_step import EngineStep

__all__ = ["GatheredLayout"]

NEG_INF = -math.inf


class GatheredLayout:
    """Only the device knows which slot each row holds (``slot_of_row``, one step): every row
    gathers its slot's tables and a membership mask makes non-member rows' writes no-ops."""

    def __init__(self, batch: BatchView, slot_of_row: torch.Tensor, slots_in_step: set[int]) -> None:
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
        step = batch.step_inputs(logits, generated, drafts=engine.real_rows is not None, pos_offset=pos_offset,
                                 real_rows=engine.real_rows)
        deaths = []
        for group in batch.group_order():
            if not (group.members & self.slots_in_step):
                continue
            rows = GatheredRows(self.slot_of_row, group.member.dev[self.slot_of_row, 0],
                                last=not (group.members & batch.masking_after(group.level)))
            if isinstance(group, ClockDecided):
                dead = self._decided_per_slot(group, step, rows, engine)
            elif isinstance(group, DecidedGroup):
                dead = decide_on_device(group, step, rows, engine.thinking, engine.window)
            else:
                dead = group.apply_gathered(step, rows)
            if dead is not None:
                deaths.append(dead)
        if batch.failures.failed & self.slots_in_step:
            self._fail_stop(step)
        return step, deaths

    def _decided_per_slot(self, group: DecidedGroup, step: StepInputs, rows: GatheredRows,
                          engine: EngineStep) -> Dead | None:
        """A decided group that reads no history: decided on the host per member slot of the step
        (``deciding.decide_slots_on_host``); nothing runs on the device unless one forces, then its
        tokens by slot go up in one upload and are gathered per row (a clock within a span, a scoped
        ``deadline``: kept only in the rows the step's span decider finds in its phase)."""
        batch = self.batch
        slots = sorted(group.members & self.slots_in_step)
        tokens = decide_slots_on_host(batch, group, slots)
        if not (tokens >= 0).any():
            return None
        by_slot = batch.slot_decisions.buffer(batch.num_slots + 1)
        by_slot[:] = -1
        by_slot[slots] = tokens
        per_row = batch.slot_decisions.upload(batch.num_slots + 1)[self.slot_of_row]
        return group.apply_device_decisions(step, rows, in_span(group, rows, per_row, engine))

    def _fail_stop(self, step: StepInputs) -> None:
        """Rows of failed requests: only their stop token (a deliberate override of every mask)."""
        batch = self.batch
        where = batch.failures.failed_member.dev[self.slot_of_row, 0]
        step.logits.masked_fill_(where[:, None], NEG_INF)
        stops = batch.stop.dev[self.slot_of_row, 0].clamp(min=0)[:, None]
        step.logits.scatter_(1, stops, torch.where(where[:, None], torch.zeros_like(stops, dtype=step.logits.dtype),
                                                   step.logits.gather(1, stops)))
