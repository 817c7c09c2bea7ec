"""``allowed_tokens``: every id outside a fixed set masked every step: its processor, template and
resident group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.allowed_tokens import AllowedTokens, AllowedTokensSpec

from .base import IndexCache, RealizeContext
from .ops import KeepOnly, RowOp, apply_op, fill_rows
from .slots import NEG_INF, Dead, GatheredRows, IdsGroup, ListedRows, StepInputs, Template, listed_positions

__all__ = ['KIND', 'AllowedTokensGroup', 'AllowedTokensProcessor', 'AllowedTokensTemplate', 'factory']

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = AllowedTokensSpec | AllowedTokens

KIND = "allowed_tokens"

class AllowedTokensGroup(IdsGroup):
    restrictive = True

    def _write(self, slot: int, template: AllowedTokensTemplate) -> None:
        self.ids.set(slot, template.ids)

    def apply_listed(self, step: StepInputs, rows: ListedRows) -> Dead:
        flat = self._cache["flat"]
        kept = step.flat.index_select(0, flat)
        fill_rows(step.logits, rows.runs, rows.rows_dev)
        step.flat.index_copy_(0, flat, kept)
        return Dead(rows.rows_dev, rows.slots_dev, flat.view(len(rows.rows), -1),
                    listed_positions(step, rows.rows_dev, rows.identity), rows.stop_index, rows.can_stop)

    def apply_gathered(self, step: StepInputs, rows: GatheredRows) -> Dead:
        ids = self.ids.dev[rows.slot_of_row]
        kept = step.logits.gather(1, ids)
        step.logits.masked_fill_(rows.member[:, None], NEG_INF)
        step.logits.scatter_(1, ids, kept)
        return Dead(None, rows.slot_of_row, ids, step.generated, where=rows.member)


@dataclass(frozen=True, slots=True)
class AllowedTokensTemplate(Template):
    """Every step: every id outside ``ids`` becomes ``-inf``."""

    ids: tuple[int, ...]
    group: ClassVar[type[AllowedTokensGroup]] = AllowedTokensGroup


class AllowedTokensProcessor:
    """Every step, every id outside ``token_ids`` (plus ``eos_token_id``) becomes -inf. Allocates only
    the allowed set's size per step (gather, fill the row, write back), never a vocabulary-sized mask."""

    __slots__ = ("_index", "template")

    def __init__(self, token_ids: Sequence[int], eos_token_id: int | None = None) -> None:
        allowed = sorted(set(token_ids) | ({eos_token_id} if eos_token_id is not None else set()))
        self._index = IndexCache(allowed)
        self.template = AllowedTokensTemplate(tuple(allowed))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return KeepOnly(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> AllowedTokensProcessor:
    """A fresh processor for one ``allowed_tokens`` entry."""
    return AllowedTokensProcessor(entry.token_ids, entry.eos_token_id)
