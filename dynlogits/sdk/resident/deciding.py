"""Deciding a decided group's rows (``dynlogits.processors.modes``): on the host from each row's own
processor (with its history, or none for a clock), or on the device from the token window or the
step's device decider. A processor that raises fails its own request alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch

from dynlogits.processors.modes import DecidedGroup, SpanDecided, SpanWindowDecided, WindowDecided
from dynlogits.processors.slots import Dead, GatheredRows, ListedRows, StepInputs
from dynlogits.processors.window import TokenWindow

from ..guard import GuardedRequest
from .engine_step import EngineStep, ThinkingDecider

__all__ = ["NO_HISTORIES", "Occupants", "decide_on_device", "decide_rows_on_host", "decide_slots_on_host", "in_span"]


class _NoHistories:
    """Every row's history, for a group that reads none (``modes.ClockDecided``): empty."""

    def __getitem__(self, row: int) -> tuple[()]:
        return ()


#: typed as the histories it stands in for: a clock-decided group only indexes them
NO_HISTORIES = cast(Sequence[Sequence[int]], _NoHistories())


class Occupants(Protocol):
    """What deciding needs of the slot engine: each slot's request, and failing one."""

    requests: list[GuardedRequest | None]

    def mark_failed(self, slot: int) -> None: ...


def processor_at(occupants: Occupants, slot: int, level: int) -> Any:
    """The processor of ``slot``'s request at entry position ``level``."""
    request = occupants.requests[slot]
    assert request is not None and request.processor is not None
    return request.processor.processors[level]


def decide_rows_on_host(occupants: Occupants, group: DecidedGroup, rows: ListedRows,
                        histories: Sequence[Sequence[int]], failed_rows: list[int]) -> Any:
    """A decided group's decisions for its member rows (``DecidedGroup.decide_rows``: by default from
    each row's host processor, ``DecidedGroup.host_decision``); a row whose decision raises fails its
    request alone (its slot marked failed, its row appended to ``failed_rows``)."""
    deciders = rows.deciders
    if deciders is None:  # once per layout: the rows' processors are fixed until it changes
        level = group.level
        deciders = rows.deciders = [(row, slot, processor_at(occupants, slot, level))
                                    for row, slot in zip(rows.rows.tolist(), rows.slots.tolist())]

    def fail(row: int, slot: int, exc: Exception) -> None:
        request = occupants.requests[slot]
        assert request is not None
        request.fail_with(exc, histories[row])
        occupants.mark_failed(slot)
        failed_rows.append(row)

    return group.decide_rows(deciders, histories, fail)


def decide_slots_on_host(occupants: Occupants, group: DecidedGroup, slots: Sequence[int]) -> np.ndarray:
    """A decided group that reads no history (``modes.ClockDecided``): each of ``slots``'s decision
    (``-1``: none) from its processor with an empty history; a processor that raises fails its
    request alone (fail-stopped from the next step on)."""
    made = np.full(len(slots), -1, dtype=np.int64)
    for i, slot in enumerate(slots):
        try:
            made[i] = group.host_decision(processor_at(occupants, slot, group.level), ())
        except Exception as exc:  # a bug must not escape the sampler: fail this request alone
            request = occupants.requests[slot]
            assert request is not None
            request.fail_with(exc, ())
            occupants.mark_failed(slot)
    return made


def decide_on_device(group: DecidedGroup, step: StepInputs, rows: GatheredRows, thinking: ThinkingDecider | None,
                     window: TokenWindow | None) -> Dead | None:
    """A decided group's step on the device: from ``window`` where the group reads it
    (``modes.WindowDecided``), else by the ``thinking`` decider, applied over ``window`` where the
    group reads both (``modes.SpanWindowDecided``).

    Raises:
        ValueError: neither applies (the adapter gave no histories and no device decider)."""
    if window is not None and isinstance(group, WindowDecided):
        decided = group.decide_from_window(rows, window)
    elif thinking is not None:
        decided = thinking(group, rows)
        if window is not None and isinstance(group, SpanWindowDecided):
            return group.apply_window_decisions(step, rows, decided, window)
    else:
        raise ValueError(f"{type(group).__name__} needs the rows' histories or a device decider")
    return group.apply_device_decisions(step, rows, decided)


def in_span(group: DecidedGroup, rows: GatheredRows, tokens: torch.Tensor, engine: EngineStep) -> torch.Tensor:
    """A clock-decided group's ``tokens`` per row (``-1``: none), kept only where the step's span
    decider finds the row in the group's phase when the group also follows a span (``SpanDecided``:
    a scoped ``deadline``); else ``tokens`` as they are.

    Raises:
        ValueError: the group follows a span and the adapter gave no span decider."""
    if not isinstance(group, SpanDecided):
        return tokens
    if engine.thinking is None:
        raise ValueError(f"{type(group).__name__} needs a device span decider without host histories")
    return torch.where(engine.thinking(group, rows), tokens, -1)
