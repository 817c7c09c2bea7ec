"""``deadline``: once ``seconds`` have passed since the request arrived, its stop token is forced: its
processor, template and resident group (decided on the host from the clock, ``modes.ClockDecided``;
it reads no history, so it is resident on every runner with slots)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.deadline import Deadline, DeadlineSpec

from .base import RealizeContext, first_stop
from .modes import ClockDecided, HostForcingGroup, ScopableForcing
from .ops import ForceToken, RowOp, apply_op
from .slots import Template

__all__ = ["KIND", "DeadlineGroup", "DeadlineProcessor", "DeadlineTemplate", "factory"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = DeadlineSpec | Deadline

KIND = "deadline"


class DeadlineGroup(ScopableForcing, HostForcingGroup, ClockDecided):
    """``deadline`` on the resident path: each row's (or, where only the device knows the rows,
    each slot's) processor reads the clock on the host; nothing runs on the device before it is due.
    Scoped to a phase (``scope.ScopedClock``): a row out of phase (``neutral_history``) forces nothing."""


@dataclass(frozen=True, slots=True)
class DeadlineTemplate(Template):
    """Force ``stop`` at every step from ``due`` (wall clock) on (decided per row)."""

    due: float
    stop: int
    group: ClassVar[type[DeadlineGroup]] = DeadlineGroup


class DeadlineProcessor:
    """At every step from ``due`` on (``clock()``, by default ``time.time``), ``stop`` is forced
    (forcing never unmasks). The clock is read once per step, never waited on; the history is not read."""

    __slots__ = ("due", "stop", "template", "_clock")

    def __init__(self, due: float, stop: int, clock: Callable[[], float] = time.time) -> None:
        self.due, self.stop, self._clock = due, stop, clock
        self.template = DeadlineTemplate(due, stop)

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        return ForceToken(self.stop) if self._clock() >= self.due else None

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext, clock: Callable[[], float] = time.time) -> DeadlineProcessor:
    """A fresh processor for one ``deadline`` entry: due ``seconds`` after the request's arrival
    (``ctx.arrival_time``; unknown: now), forcing the request's stop token (``first_stop``)."""
    stop = first_stop(ctx)
    if stop is None:
        raise ValueError("deadline needs a stop token to force: the request has none (ignore_eos and no stop ids)")
    arrival = ctx.arrival_time if ctx.arrival_time is not None else clock()
    return DeadlineProcessor(arrival + float(entry.seconds), stop, clock)
