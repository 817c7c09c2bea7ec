"""Applying many requests' processors to a batch of logits with a few tensor ops per step.

This is the *host-planned* path: every step each request contributes a *plan*, its processors'
steps for this step in payload order (``RequestLogitsProcessor.plan``). A step is a ``RowOp``
(built-in kinds, plug-ins that describe their step) or an opaque processor (``python`` kind,
plug-ins) called on its row. Plans are applied level by level: level ``k`` holds the ``k``-th step
of every plan; its ``RowOp``s are grouped by type and each group is applied to all of its rows at
once (``ops.BATCHED``: index tensors the size of the listed ids, never vocab-sized), then its opaque steps are
called one row at a time. Rows are independent, so this is exactly what applying each request's
processors to its own row in order would do (``tests/sdk/test_plans.py`` compares both).

Engines with persistent request slots run built-in kinds through the resident path instead
(``dynlogits.sdk.resident``: device tables, no per-step planning); both follow ``ops``.

Containment: an opaque step that raises fails its plan (``on_error``), the rest of that plan is
skipped and every other plan is applied in full. A grouped op cannot fail on a request's data
(every id was checked against the logits width when planned); should one fail anyway, the plans
in that group are failed and the rest of the batch goes on.

Rows left with no token: a plan whose steps restrict its row to a few ids (``ForceToken``,
``KeepOnly``) has a *witness*, the ids the last such step kept; a plan with an opaque step has its
whole row checked (an opaque processor may mask anything). ``apply_plans`` returns, on the device
and without synchronizing, whether each plan's witness ids are all ``-inf`` (or, with an opaque
step, whether no logit of its row is finite) after all its steps: then the row has no token to
sample (its forced token was masked by the engine's grammar, say) and the caller fails that
request (``dynlogits.sdk.apply``).
"""

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
) -> torch.Tensor | None:
    """Apply ``plans[i]`` to ``logits[rows[i]]`` (in place) for every ``i``.

    ``logits`` is ``[num_rows, vocab]``; each row appears at most once in ``rows``. Opaque steps
    are called as ``step(histories[i], logits[rows[i]])``; one that raises is reported through
    ``on_error`` (or re-raised when ``on_error`` is ``None``) and the rest of its plan is skipped,
    while every other plan is applied in full. Returns, on the device, which plans' rows have no
    token left (``EmptyRows``, see the module doc), or ``None`` when no plan restricts its row or
    runs an opaque step. Never synchronizes with the device for built-in steps.
    """
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
        groups: dict[type, list[tuple[int, int]]] = {}
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
