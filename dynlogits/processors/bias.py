"""``logit_bias``: add a fixed bias to some ids every step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .base import IndexCache
from .ops import AddBias, RowOp, apply_op
from .templates import BiasTemplate

__all__ = ["LogitBiasProcessor"]


class LogitBiasProcessor:
    """Every step, ``logits[id] += bias[id]`` for each listed id."""

    __slots__ = ("_index", "template")

    def __init__(self, bias: Mapping[int, float]) -> None:
        ids = sorted(bias)
        self._index = IndexCache(ids, [bias[i] for i in ids])
        self.template = BiasTemplate(tuple(ids), tuple(float(bias[i]) for i in ids))

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return AddBias(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
