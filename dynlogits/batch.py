"""Applying many requests' processors to a batch of logits with a few tensor ops per step.

Each request contributes a *plan*: its processors' steps for this decoding step, in payload
order (``RequestLogitsProcessor.plan``). A step is a ``RowOp`` (built-in kinds) or an opaque
processor (``python`` kind, plug-ins) that must be called on its row. Plans are applied level by
level: level ``k`` holds the ``k``-th step of every plan; its ``RowOp``s are grouped by type and
each group is applied to all of its rows at once (one ``index_put_``/``index_fill_`` over the
batch tensor, index tensors the size of the listed ids, never vocab-sized), then its opaque
steps are called one row at a time. Rows are independent, so this is exactly what applying each
request's processors to its own row in order would do (``tests/test_batch.py`` compares both).
The number of tensor ops per step grows with the longest plan, not with the number of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynlogits.processors.ops import ROW_OPS, AddBias, ForceToken, KeepOnly, MaskIds, RowOp

__all__ = ["Plan", "Step", "apply_plans"]

#: One processor step: a ``RowOp``, or an opaque ``processor(input_ids, row)`` to call on the row.
Step = Any
Plan = Sequence[Step]

#: Called with the plan's index and the exception an opaque step raised; later steps of that
#: plan are skipped.
OnError = Callable[[int, Exception], None]


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=logits.device)


def _pairs(logits: torch.Tensor, items: list[tuple[int, Any]]) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """(row index per id, column ids, per-item value tensors) for ops that carry an IndexCache."""
    cached = [op.index.get(logits) for _, op in items]
    cols = torch.cat([idx for idx, _ in cached]) if len(cached) > 1 else cached[0][0]
    counts = torch.tensor([idx.numel() for idx, _ in cached], dtype=torch.long, device=logits.device)
    rows = torch.repeat_interleave(_rows(logits, [r for r, _ in items]), counts)
    return rows, cols, [values for _, values in cached]


def _mask(logits: torch.Tensor, items: list[tuple[int, MaskIds]]) -> None:
    rows, cols, _ = _pairs(logits, items)
    logits.index_put_((rows, cols), torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))


def _add(logits: torch.Tensor, items: list[tuple[int, AddBias]]) -> None:
    rows, cols, values = _pairs(logits, items)
    logits.index_put_((rows, cols), torch.cat(values) if len(values) > 1 else values[0], accumulate=True)


def _keep(logits: torch.Tensor, items: list[tuple[int, KeepOnly]]) -> None:
    rows, cols, _ = _pairs(logits, items)
    kept = logits[rows, cols]
    logits.index_fill_(0, _rows(logits, [r for r, _ in items]), float("-inf"))
    logits.index_put_((rows, cols), kept)


def _force(logits: torch.Tensor, items: list[tuple[int, ForceToken]]) -> None:
    rows = _rows(logits, [r for r, _ in items])
    tokens = torch.tensor([op.token_id for _, op in items], dtype=torch.long, device=logits.device)
    logits.index_fill_(0, rows, float("-inf"))
    logits.index_put_((rows, tokens), torch.tensor(0.0, dtype=logits.dtype, device=logits.device))


_APPLY: dict[type, Callable[[torch.Tensor, list[Any]], None]] = {
    MaskIds: _mask,
    AddBias: _add,
    KeepOnly: _keep,
    ForceToken: _force,
}


def apply_plans(
    logits: torch.Tensor,
    rows: Sequence[int],
    plans: Sequence[Plan],
    histories: Sequence[Sequence[int]],
    *,
    on_error: OnError | None = None,
) -> None:
    """Apply ``plans[i]`` to ``logits[rows[i]]`` (in place) for every ``i``.

    ``logits`` is ``[num_rows, vocab]``; each row appears at most once in ``rows``. Opaque steps
    are called as ``step(histories[i], logits[rows[i]])``; one that raises is reported through
    ``on_error`` (or re-raised when ``on_error`` is ``None``) and the rest of its plan is skipped,
    while every other plan is applied in full.
    """
    failed: set[int] = set()
    depth = max((len(p) for p in plans), default=0)
    for level in range(depth):
        groups: dict[type, list[tuple[int, RowOp]]] = {}
        for i, plan in enumerate(plans):
            if level >= len(plan) or i in failed:
                continue
            step = plan[level]
            if isinstance(step, ROW_OPS):
                groups.setdefault(type(step), []).append((rows[i], step))
                continue
            try:
                step(histories[i], logits[rows[i]])
            except Exception as exc:
                if on_error is None:
                    raise
                failed.add(i)
                on_error(i, exc)
        for op_type, items in groups.items():
            _APPLY[op_type](logits, items)
