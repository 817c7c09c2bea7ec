"""``min_tokens``: no stop/EOS token before a minimum number of generated tokens: its processor,
template and resident group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.min_tokens import MinTokens, MinTokensSpec

from .base import IndexCache, RealizeContext
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, GatheredRows, IdsGroup, ListedRows, StepInputs, Template, listed_positions, mask_gathered

__all__ = ['KIND', 'MinTokensGroup', 'MinTokensProcessor', 'MinTokensTemplate', 'factory']

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = MinTokensSpec | MinTokens

KIND = "min_tokens"

class MinTokensGroup(IdsGroup):
    positional = True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.minimum = self.table(torch.long)

    def _write(self, slot: int, template: MinTokensTemplate) -> None:
        self.ids.set(slot, template.ids)
        self.minimum.set(slot, [template.min_tokens])

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["minimum"] = self.minimum.dev[rows.slots_dev, 0]

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> None:
        assert step.generated is not None
        flat = self._cache["flat"]
        positions = listed_positions(step, rows.rows_dev, rows.identity)
        active = positions < self._cache["minimum"]
        current = step.flat.index_select(0, flat)
        step.flat.index_copy_(0, flat, current.masked_fill_(active[:, None].expand(-1, self.ids.width).reshape(-1), NEG_INF))

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> None:
        assert step.generated is not None
        active = rows.member & (step.generated < self.minimum.dev[rows.slot_of_row, 0])
        mask_gathered(step.logits, self.ids.dev[rows.slot_of_row], active)


@dataclass(frozen=True, slots=True)
class MinTokensTemplate(Template):
    """A step at generated count ``n``: ``row[ids] = -inf`` while ``n < min_tokens``."""

    ids: tuple[int, ...]
    min_tokens: int
    group: ClassVar[type[MinTokensGroup]] = MinTokensGroup


class MinTokensProcessor:
    """While ``len(input_ids) < min_tokens`` the stop ids become -inf; afterwards nothing changes."""

    __slots__ = ("min_tokens", "_index", "template")

    def __init__(self, min_tokens: int, stop_token_ids: Sequence[int]) -> None:
        self.min_tokens = min_tokens
        ids = sorted(set(stop_token_ids))
        self._index = IndexCache(ids)
        self.template = MinTokensTemplate(tuple(ids), min_tokens)

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        return MaskIds(self._index) if len(input_ids) < self.min_tokens else None

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> MinTokensProcessor:
    """A fresh processor for one ``min_tokens`` entry."""
    return MinTokensProcessor(entry.min_tokens, entry.stop_token_ids)
