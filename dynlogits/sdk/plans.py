"""Applying many requests' processors to a batch of logits with a few tensor ops per step.

This is the *host-planned* path: every step each request contributes a *plan*, its processors'
steps for this step in payload order (``RequestLogitsProcessor.plan``). A step is a ``RowOp``
(built-in kinds, plug-ins that describe their step) or an opaque processor (``python`` kind,
plug-ins) called on its row. Plans are applied level by level: level ``k`` holds the ``k``-th step
of every plan; its ``RowOp``s are grouped by type and each group is applied to all of its rows at
once (index tensors the size of the listed ids, never vocab-sized), then its opaque steps are
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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynlogits.processors.ops import ROW_OPS, AddBias, ForceToken, KeepOnly, MaskIds, RowOp

from dynlogits.uploads import to_device

__all__ = ["EmptyRows", "Plan", "Step", "apply_plans", "fill_rows", "row_runs"]

NEG_INF = -math.inf

#: One processor step: a ``RowOp``, or an opaque ``processor(input_ids, row)`` to call on the row.
Step = Any
Plan = Sequence[Step]

#: Called with the plan's index and the exception its step raised; later steps of that plan are skipped.
OnError = Callable[[int, Exception], None]


def _index(logits: torch.Tensor, values: list[int]) -> torch.Tensor:
    return to_device(values, torch.long, logits.device)


def _pairs(logits: torch.Tensor, items: list[tuple[int, Any]]) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """(row index per id, column ids, per-item value tensors) for ops that carry an IndexCache."""
    cached = [op.index.get(logits) for _, op in items]
    cols = torch.cat([idx for idx, _ in cached]) if len(cached) > 1 else cached[0][0]
    counts = [idx.numel() for idx, _ in cached]
    rows = torch.repeat_interleave(_index(logits, [r for r, _ in items]), _index(logits, counts), output_size=sum(counts))
    return rows, cols, [values for _, values in cached]


def _mask(logits: torch.Tensor, items: list[tuple[int, MaskIds]]) -> None:
    rows, cols, _ = _pairs(logits, items)
    logits.index_put_((rows, cols), logits.new_full((), NEG_INF))  # filled on the device, not copied from the host


def _add(logits: torch.Tensor, items: list[tuple[int, AddBias]]) -> None:
    rows, cols, values = _pairs(logits, items)
    logits.index_put_((rows, cols), torch.cat(values) if len(values) > 1 else values[0], accumulate=True)


def fill_rows(logits: torch.Tensor, runs: Sequence[tuple[int, int]], rows_dev: torch.Tensor | None) -> None:
    """``-inf`` into whole rows, given as ``runs`` (``row_runs``) and, on an accelerator, as
    ``rows_dev`` on the device: there one ``index_fill_``, however the rows interleave with others;
    on the CPU one memset per run (CPU's ``index_fill_`` over dim 0 is several times slower)."""
    if logits.device.type != "cpu":
        assert rows_dev is not None
        logits.index_fill_(0, rows_dev, NEG_INF)
        return
    for start, stop in runs:
        logits[start:stop].fill_(NEG_INF)


def row_runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """``rows`` as ``[start, stop)`` runs of consecutive indices (in sorted order)."""
    runs: list[tuple[int, int]] = []
    for r in sorted(rows):
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


def _keep(logits: torch.Tensor, items: list[tuple[int, KeepOnly]]) -> None:
    rows, cols, _ = _pairs(logits, items)
    kept = logits[rows, cols]
    whole = [r for r, _ in items]
    fill_rows(logits, row_runs(whole), _index(logits, whole) if logits.device.type != "cpu" else None)
    logits.index_put_((rows, cols), kept)


def _force(logits: torch.Tensor, items: list[tuple[int, ForceToken]]) -> None:
    rows = _index(logits, [r for r, _ in items])
    tokens = _index(logits, [op.token_id for _, op in items])
    kept = logits[rows, tokens]
    fill_rows(logits, row_runs([r for r, _ in items]), rows)
    logits.index_put_((rows, tokens), kept.masked_fill_(~torch.isneginf(kept), 0.0))  # NaN too: only -inf is a mask


_APPLY: dict[type, Callable[[torch.Tensor, list[Any]], None]] = {
    MaskIds: _mask,
    AddBias: _add,
    KeepOnly: _keep,
    ForceToken: _force,
}


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
                _APPLY[op_type](logits, [(rows[i], op) for i, op in members])
            except Exception as exc:  # not a request's data (ids were checked): fail the group, keep the batch
                for i, _ in members:
                    fail(i, exc)
    for i in failed:
        witnesses.pop(i, None)
        opaque.discard(i)
    return _empty_rows(logits, rows, witnesses, opaque)
