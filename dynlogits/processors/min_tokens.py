"""``min_tokens``: no stop/EOS token before a minimum number of generated tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import IndexCache
from .ops import MaskIds, RowOp, apply_op
from .templates import MaskBeforeTemplate

__all__ = ["MinTokensProcessor"]


class MinTokensProcessor:
    """While ``len(input_ids) < min_tokens`` the stop ids become -inf; afterwards nothing changes."""

    __slots__ = ("min_tokens", "_index", "template")

    def __init__(self, min_tokens: int, stop_token_ids: Sequence[int]) -> None:
        self.min_tokens = min_tokens
        ids = sorted(set(stop_token_ids))
        self._index = IndexCache(ids)
        self.template = MaskBeforeTemplate(tuple(ids), min_tokens)

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        return MaskIds(self._index) if len(input_ids) < self.min_tokens else None

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
