"""``banned_tokens`` and ``allowed_tokens``: fixed sets of ids masked every step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import IndexCache
from .ops import KeepOnly, MaskIds, RowOp, apply_op
from .templates import KeepTemplate, MaskTemplate

__all__ = ["AllowedTokensProcessor", "BannedTokensProcessor"]


class BannedTokensProcessor:
    """Every step, the banned ids' logits become -inf; nothing else changes."""

    __slots__ = ("_index", "template")

    def __init__(self, token_ids: Sequence[int]) -> None:
        ids = sorted(set(token_ids))
        self._index = IndexCache(ids)
        self.template = MaskTemplate(tuple(ids))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return MaskIds(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


class AllowedTokensProcessor:
    """Every step, every id outside ``token_ids`` (plus ``eos_token_id``) becomes -inf.

    Allowed values are kept: they are gathered (a tensor of the allowed set's
    size), the row is filled with -inf, and they are written back — no
    vocabulary-sized allocation per step.
    """

    __slots__ = ("_index", "template")

    def __init__(self, token_ids: Sequence[int], eos_token_id: int | None = None) -> None:
        allowed = sorted(set(token_ids) | ({eos_token_id} if eos_token_id is not None else set()))
        self._index = IndexCache(allowed)
        self.template = KeepTemplate(tuple(allowed))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return KeepOnly(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
