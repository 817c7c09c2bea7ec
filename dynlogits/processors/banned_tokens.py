"""``banned_tokens``: a fixed set of ids masked every step: its processor, template and resident group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.banned_tokens import BannedTokens, BannedTokensSpec

from .base import IndexCache, RealizeContext
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, GatheredRows, IdsGroup, ListedRows, StepInputs, Template, mask_gathered

__all__ = ['KIND', 'BannedTokensGroup', 'BannedTokensProcessor', 'BannedTokensTemplate', 'factory']

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = BannedTokensSpec | BannedTokens

KIND = "banned_tokens"

class BannedTokensGroup(IdsGroup):

    def _write(self, slot: int, template: BannedTokensTemplate) -> None:
        self.ids.set(slot, template.ids)

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> None:
        step.flat.index_fill_(0, self._cache["flat"], NEG_INF)

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> None:
        mask_gathered(step.logits, self.ids.dev[rows.slot_of_row], rows.member)


@dataclass(frozen=True, slots=True)
class BannedTokensTemplate(Template):
    """Every step: ``row[ids] = -inf``."""

    ids: tuple[int, ...]
    group: ClassVar[type[BannedTokensGroup]] = BannedTokensGroup


class BannedTokensProcessor:
    """Every step, the banned ids' logits become -inf; nothing else changes."""

    __slots__ = ("_index", "template")

    def __init__(self, token_ids: Sequence[int]) -> None:
        ids = sorted(set(token_ids))
        self._index = IndexCache(ids)
        self.template = BannedTokensTemplate(tuple(ids))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return MaskIds(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> BannedTokensProcessor:
    """A fresh processor for one ``banned_tokens`` entry."""
    return BannedTokensProcessor(entry.token_ids)
