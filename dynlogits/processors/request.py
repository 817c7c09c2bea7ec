"""All processors of one request, as one callable: what realization builds and the apply paths run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import BaseLogitsProcessor
from .ops import ROW_OPS, check_op

__all__ = ["RequestLogitsProcessor"]


class RequestLogitsProcessor:
    """All processors of one request, applied in payload order, in place.

    ``__call__(output_ids, logits_row)``: the tokens generated so far and the 1-D row. With
    ``vocab_size`` (the logits width) every planned op is checked (``check_op``): one naming an id
    outside the row raises ``IndexError`` from ``plan``, failing this request only."""

    __slots__ = ("processors", "vocab_size")

    def __init__(self, processors: Sequence[BaseLogitsProcessor], vocab_size: int | None = None) -> None:
        self.processors = tuple(processors)
        self.vocab_size = vocab_size

    def __call__(self, output_ids: Sequence[int], logits_row: torch.Tensor) -> None:
        for processor in self.processors:
            processor(output_ids, logits_row)

    def plan(self, output_ids: Sequence[int]) -> list[Any]:
        """This step's work for ``dynlogits.sdk.plans.apply_plans``, in payload order: a ``RowOp`` per
        built-in processor that acts now, the processor itself for any other kind."""
        steps: list[Any] = []
        for processor in self.processors:
            row_op = getattr(processor, "row_op", None)
            if row_op is None:
                steps.append(processor)
                continue
            op = row_op(output_ids)
            if op is not None and not isinstance(op, ROW_OPS):
                raise TypeError(f"{type(processor).__name__}.row_op returned {type(op).__name__}, not a RowOp or None")
            if op is not None:
                if self.vocab_size is not None:
                    check_op(op, self.vocab_size)
                steps.append(op)
        return steps

    def __repr__(self) -> str:
        return f"RequestLogitsProcessor({', '.join(type(p).__name__ for p in self.processors)})"
