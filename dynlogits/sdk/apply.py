"""Duty 4, apply: a batch's rows, in place, with per-request failure isolation.

For engines that hand over rows and histories every step (SGLang, TensorRT-LLM, transformers,
opaque processors on vLLM); slot engines run built-in kinds on ``dynlogits.sdk.resident``. Each
request plans its step (``GuardedRequest.plan``) and ``plans.apply_plans`` applies the batch.

Guarantees: a request whose planning or processor fails is fail-stopped on its rows and reported
once; the others are applied in full. A row left with no token is fail-stopped on the device in the
same step and its request fails once the host learns it (``readback``). Nothing raises for one
request's fault."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dynlogits.processors.uploads import to_device

from .guard import NO_FINITE_LOGIT, NO_TOKEN_LEFT, GuardedRequest
from .plans import EmptyRows, apply_plans
from .readback import INBOX, DeviceFlags

__all__ = ["apply_draft_row", "apply_row", "apply_rows", "stop_rows_where"]


def stop_rows_where(logits: torch.Tensor, rows: Sequence[int], stops: Sequence[int], dead: torch.Tensor) -> None:
    """Where ``dead[i]`` (a device bool), make ``stops[i]`` the one choice of the all ``-inf`` row
    ``rows[i]``; elsewhere leave it unchanged. No host synchronization."""
    index = (to_device(list(rows), torch.long, logits.device), to_device(list(stops), torch.long, logits.device))
    logits.index_put_(index, torch.where(dead, torch.zeros_like(logits[index]), logits[index]))


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

    empty = apply_plans(logits, [rows[i] for i in live], plans, [histories[i] for i in live], on_error=failed)
    if empty is not None:
        _stop_empty_rows(logits, [rows[i] for i in live], [requests[i] for i in live], empty)
        flags = DeviceFlags(empty.dead)
        noted = [requests[i] for i in live]
        for j, i in enumerate(live):
            reason = NO_FINITE_LOGIT if j in empty.opaque else NO_TOKEN_LEFT
            requests[i].note_dead(flags, j, reason.format(n=len(histories[i])))

        def poll_noted() -> None:
            for each in noted:
                each.poll()

        INBOX.when_landed(flags.landed, poll_noted, logits.device)
    for row, request in zip(rows, requests):
        if request.failed:
            request.force_stop(logits[row])


def _stop_empty_rows(logits: torch.Tensor, rows: Sequence[int], requests: Sequence[GuardedRequest],
                     empty: EmptyRows) -> None:
    """Fail-stop, on the device, the rows ``empty`` flags whose requests have a stop token: the
    stop token becomes the one choice of the row (rows an opaque processor left are masked whole
    first: they may hold ``+inf`` or NaN)."""
    stoppable = [j for j, request in enumerate(requests) if request.stop_token_id is not None]
    if not stoppable:
        return
    device = logits.device
    dead = empty.dead.index_select(0, to_device(stoppable, torch.long, device))
    opaque = [k for k, j in enumerate(stoppable) if j in empty.opaque]
    if opaque:
        at = to_device([rows[stoppable[k]] for k in opaque], torch.long, device)
        whole = dead.index_select(0, to_device(opaque, torch.long, device))
        logits.index_copy_(0, at, logits.index_select(0, at).masked_fill_(whole[:, None], -math.inf))
    stops = [stop for j in stoppable if (stop := requests[j].stop_token_id) is not None]  # every one, by ``stoppable``
    stop_rows_where(logits, [rows[j] for j in stoppable], stops, dead)


def apply_row(request: GuardedRequest, history: Sequence[int], row: torch.Tensor) -> torch.Tensor:
    """Apply ``request`` to the 1-D ``row`` (its next committed position) in place and return
    ``row``: ``apply_rows`` for one row, for engines that call one processor per request."""
    apply_rows(row.unsqueeze(0), [0], [request], [history])
    return row


def apply_draft_row(request: GuardedRequest, history: Sequence[int], row: torch.Tensor) -> None:
    """Apply ``request`` to the 1-D ``row`` of a draft position (speculative decoding), in place.

    A failure here stops this row only and is not recorded: the draft may be rejected; if it is
    accepted, the request meets the same failure on its next committed row."""
    if request.failed or request.processor is None:
        return
    try:
        plan = request.processor.plan(history)
        empty = apply_plans(row.unsqueeze(0), [0], [plan], [history])
    except Exception:  # stop this draft row only (see above)
        request.force_stop(row)
        return
    if empty is not None:
        _stop_empty_rows(row.unsqueeze(0), [0], [request], empty)
