"""``deadline``: once ``seconds`` have passed since the request arrived, its stop token is forced."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .base import RealizeContext
from .ops import ForceToken, RowOp, apply_op

__all__ = ["KIND", "DeadlineProcessor", "factory"]

KIND = "deadline"


class DeadlineProcessor:
    """At every step from ``arrival + seconds`` on (wall clock, ``time.time``), the stop token is
    forced (forcing never unmasks). The clock is read once per step, never waited on."""

    __slots__ = ("due", "stop", "_clock")

    def __init__(self, due: float, stop: int, clock: Callable[[], float] = time.time) -> None:
        self.due, self.stop, self._clock = due, stop, clock

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        return ForceToken(self.stop) if self._clock() >= self.due else None

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Any, ctx: RealizeContext) -> DeadlineProcessor:
    """A fresh processor for one ``deadline`` entry: due ``seconds`` after the request's arrival."""
    if not ctx.stop_token_ids:
        raise ValueError("deadline needs a stop token to force: the request has none (ignore_eos and no stop ids)")
    arrival = ctx.arrival_time if ctx.arrival_time is not None else time.time()
    return DeadlineProcessor(arrival + float(entry.seconds), ctx.stop_token_ids[0])
