"""Duty 4, apply: a batch's rows, in place, with per-request failure isolation.

Each request plans its step (``GuardedRequest.plan``); the plans go to
``dynlogits.batch.apply_plans``, which applies every built-in kind to all rows that need it with a
few tensor ops per step and calls opaque processors (``python`` kind, plug-ins) on their own row.
A request whose planning or processor fails is fail-stopped on its row(s) and reported once; the
others are applied in full. Nothing here raises for one request's fault.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynlogits.batch import apply_plans

from .guard import GuardedRequest

__all__ = ["apply_rows"]


def apply_rows(
    logits: torch.Tensor,
    rows: Sequence[int],
    requests: Sequence[GuardedRequest],
    histories: Sequence[Sequence[int]],
) -> None:
    """Apply ``requests[i]`` to ``logits[rows[i]]`` given ``histories[i]``, in place, for every ``i``.

    ``logits`` is ``[num_rows, vocab]``; the three sequences have equal length; each row appears
    at most once; a request may own several rows (beams, samples, draft tokens), each with its own
    history. ``ValueError`` when the lengths differ (an adapter bug, not a request's fault).
    """
    if len(rows) != len(requests) or len(rows) != len(histories):
        raise ValueError(f"rows, requests and histories differ in length: {len(rows)}, {len(requests)}, {len(histories)}")
    live: list[int] = []
    plans = []
    for i, request in enumerate(requests):
        plan = request.plan(histories[i])
        if plan is not None:
            live.append(i)
            plans.append(plan)

    def failed(j: int, exc: Exception) -> None:
        i = live[j]
        requests[i].fail_with(exc, histories[i])

    apply_plans(logits, [rows[i] for i in live], plans, [histories[i] for i in live], on_error=failed)
    for row, request in zip(rows, requests):
        if request.failed:
            request.force_stop(logits[row])
