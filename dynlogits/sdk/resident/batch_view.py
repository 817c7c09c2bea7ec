"""``BatchView``: what a layout (``listed``, ``gathered``) reads of the ``SlotBatch`` that owns it.
A Protocol, so the layouts depend on this contract and not on the batch's module."""

from __future__ import annotations

from typing import Protocol

import torch

from dynlogits.processors.slots import Group, SlotTable, StepInputs
from dynlogits.processors.uploads import StepUpload

from ..guard import GuardedRequest
from .failures import Failures

__all__ = ["BatchView"]


class BatchView(Protocol):
    """The batch's slots, tables and groups as a layout's step reads them; ``step_inputs`` builds
    what one step gives every group, ``flush`` uploads the tables' pending writes, ``mark_failed``
    fails a slot's request (what ``deciding.Occupants`` asks too)."""

    num_slots: int
    device: torch.device
    requests: list[GuardedRequest | None]
    groups: dict[tuple[int, type[Group]], Group]
    sentinel: int
    stop: SlotTable
    failures: Failures
    slot_decisions: StepUpload

    def flush(self) -> None: ...

    def mark_failed(self, slot: int) -> None: ...

    def group_order(self) -> list[Group]: ...

    def masking_after(self, level: int) -> set[int]: ...

    def step_inputs(self, logits: torch.Tensor, generated: torch.Tensor | None, *, drafts: bool,
                    pos: torch.Tensor | None = None, pos_offset: torch.Tensor | None = None,
                    real_rows: torch.Tensor | None = None) -> StepInputs: ...
