"""Applying many requests' processors to a batch of logits with a few tensor ops per step.

The host-planned path: every step each request contributes a plan, its processors' steps in
payload order (``RequestLogitsProcessor.plan``): ``RowOp``s or opaque processors. Level ``k`` holds
every plan's ``k``-th step; its ``RowOp``s are applied by type to all their rows at once
(``ops.BATCHED``, never vocab-sized), then its opaque steps row by row. The result equals applying
each request's processors to its own row in order (``tests/sdk/test_plans.py``).

Containment: an opaque step that raises fails its plan (``on_error``) and the rest of that plan is
skipped; a grouped op that fails anyway fails the plans of its group. Rows left with no token are
reported on the device (``EmptyRows``): a plan's witness ids (the last restricting step's) all
``-inf``, or, with an opaque step, no finite logit in its row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynlogits.processors.ops import BATCHED, ROW_OPS, ForceToken, KeepOnly, RowOp
from dynlogits.processors.uploads import to_device

__all__ = ["EmptyRows", "Plan", "Step", "apply_plans"]

#: One processor step: a ``RowOp``, or an opaque ``processor(input_ids, row)`` to call on the row.
Step = Any
Plan = Sequence[Step]

#: Called with the plan's index and the exception its step raised; later steps of that plan are skipped.
OnError = Callable[[int, Exception], None]


def _index(logits: torch.Tensor, values: list[int]) -> torch.Tensor:
    return to_device(values, torch.long, logits.device)


@dataclass(frozen=True)
class EmptyRows:
    """``dead[i]`` (device bool): plan ``i``'s row was left with no token to sample; ``opaque``: the
    plans with an opaque step, whose whole row was checked for a finite logit."""

    dead: torch.Tensor
    opaque: frozenset[int]


def _empty_rows(logits: torch.Tensor, rows: Sequence[int], witnesses: dict[int, RowOp],
                opaque: set[int]) -> EmptyRows | None:
    """Per plan, on the device: whether its witness ids are all -inf, or, for a plan with an opaque
    step, no logit of its row is finite (``False`` for a plan with neither)."""
    if not witnesses and not opaque:
        return None
    dead = torch.zeros(len(rows), dtype=torch.bool, device=logits.device)
    forced = [(i, op.token_id) for i, op in witnesses.items() if isinstance(op, ForceToken)]
    if forced:
        plans = _index(logits, [i for i, _ in forced])
        values = logits[_index(logits, [rows[i] for i, _ in forced]), _index(logits, [t for _, t in forced])]
        dead.index_put_((plans,), torch.isneginf(values))
    for i, op in witnesses.items():
        if isinstance(op, KeepOnly):
            idx, _ = op.index.get(logits)
            dead[i] = torch.isneginf(logits[rows[i]].index_select(0, idx)).all()
    if opaque:
        order = sorted(opaque)
        plans = _index(logits, order)
        empty = ~torch.isfinite(logits.index_select(0, _index(logits, [rows[i] for i in order]))).any(1)
        dead.index_copy_(0, plans, dead.index_select(0, plans) | empty)
    return EmptyRows(dead, frozenset(opaque))


def apply_plans(
    logits: torch.Tensor,
    rows: Sequence[int],
    plans: Sequence[Plan],
    histories: Sequence[Sequence[int]],
    *,
    on_error: OnError | None = None,
) -> EmptyRows | None:
    """Apply ``plans[i]`` to ``logits[rows[i]]`` (in place) for every ``i``.

    ``logits`` is ``[num_rows, vocab]``; each row appears at most once. Opaque steps are called as
    ``step(histories[i], logits[rows[i]])``; one that raises goes to ``on_error`` (re-raised when
    ``None``) and the rest of its plan is skipped. Returns which plans' rows have no token left
    (``EmptyRows``, on the device), or ``None`` when no plan restricts its row or runs an opaque
    step. Never synchronizes for built-in steps."""
    failed: set[int] = set()
    opaque: set[int] = set()

    def fail(i: int, exc: Exception) -> None:
        if on_error is None:
            raise exc
        failed.add(i)
        on_error(i, exc)

    witnesses: dict[int, RowOp] = {}
    depth = max((len(p) for p in plans), default=0)
    for level in range(depth):
        groups: dict[type, list[tuple[int, RowOp]]] = {}
        for i, plan in enumerate(plans):
            if level >= len(plan) or i in failed:
                continue
            step = plan[level]
            if isinstance(step, ROW_OPS):
                groups.setdefault(type(step), []).append((i, step))
                if isinstance(step, (ForceToken, KeepOnly)):
                    witnesses[i] = step
                continue
            try:
                step(histories[i], logits[rows[i]])
                opaque.add(i)
            except Exception as exc:
                fail(i, exc)
        for op_type, members in groups.items():
            try:
                BATCHED[op_type](logits, [(rows[i], op) for i, op in members])
            except Exception as exc:  # not a request's data (ids were checked): fail the group, keep the batch
                for i, _ in members:
                    fail(i, exc)
    for i in failed:
        witnesses.pop(i, None)
        opaque.discard(i)
    return _empty_rows(logits, rows, witnesses, opaque)
