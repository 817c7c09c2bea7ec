"""``logit_bias``: a fixed bias added to some ids every step: its processor, template and resident
group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.logit_bias import LogitBias, LogitBiasSpec

from .base import IndexCache, RealizeContext
from .ops import AddBias, RowOp, apply_op
from .slots import GatheredRows, IdsGroup, ListedRows, StepInputs, Template

__all__ = ['KIND', 'LogitBiasGroup', 'LogitBiasProcessor', 'LogitBiasTemplate', 'factory']

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = LogitBiasSpec | LogitBias

KIND = "logit_bias"

class LogitBiasGroup(IdsGroup):
    writes_neg_inf = False

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.values = self.table(torch.float32, pad=0.0)

    def _write(self, slot: int, template: LogitBiasTemplate) -> None:
        self.ids.set(slot, template.ids)
        self.values.set(slot, template.values)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["values"] = self.values.dev[rows.slots_dev].reshape(-1)

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> None:
        values = self._cache["values"]
        if values.dtype != step.flat.dtype:
            values = self._cache["values"] = values.to(step.flat.dtype)
        step.flat.index_add_(0, self._cache["flat"], values)

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> None:
        values = self.values.dev[rows.slot_of_row] * rows.member[:, None]
        step.logits.scatter_add_(1, self.ids.dev[rows.slot_of_row], values.to(step.logits.dtype))


@dataclass(frozen=True, slots=True)
class LogitBiasTemplate(Template):
    """Every step: ``row[ids] += values``."""

    ids: tuple[int, ...]
    values: tuple[float, ...]
    group: ClassVar[type[LogitBiasGroup]] = LogitBiasGroup


class LogitBiasProcessor:
    """Every step, ``logits[id] += bias[id]`` for each listed id."""

    __slots__ = ("_index", "template")

    def __init__(self, bias: Mapping[int, float]) -> None:
        ids = sorted(bias)
        self._index = IndexCache(ids, [bias[i] for i in ids])
        self.template = LogitBiasTemplate(tuple(ids), tuple(float(bias[i]) for i in ids))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return AddBias(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> LogitBiasProcessor:
    """A fresh processor for one ``logit_bias`` entry."""
    return LogitBiasProcessor({int(k): v for k, v in entry.bias.items()})
