"""Row operations: what a built-in processor does to its row at one step, as data.

``row_op(input_ids)`` returns a ``RowOp`` (``None``: leave the row alone). ``apply_op`` applies one
op to one 1-D row (a processor's ``__call__`` is ``apply_op(row_op(...))``);
``BATCHED[type(op)](logits, [(row, op), ...])`` applies ops of one type to many rows at once
(``dynlogits.sdk.plans``). Kinds share ops (``forced_sequence`` and ``thinking_budget`` both force).

Masks are never undone: ``ForceToken`` leaves its token the only choice unless it is already
``-inf`` (the engine's grammar, an earlier entry), and then the whole row is ``-inf``. ``witness``
names the ids that must stay finite for the ops that restrict a row (``ForceToken``, ``KeepOnly``);
a request with none left is failed (``dynlogits.sdk.guard``), never sampled from an all ``-inf`` row."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

import torch

from .base import IndexCache
from .uploads import to_device

__all__ = [
    "BATCHED",
    "ROW_OPS",
    "AddBias",
    "ForceToken",
    "KeepOnly",
    "MaskIds",
    "PlannedProcessor",
    "RowOp",
    "apply_op",
    "check_op",
    "fill_rows",
    "force_keeping_masks",
    "is_restrictive",
    "row_runs",
]

NEG_INF = -math.inf


@dataclass(frozen=True, slots=True)
class MaskIds:
    """``row[ids] = -inf``."""

    index: IndexCache


@dataclass(frozen=True, slots=True)
class AddBias:
    """``row[ids] += values`` (the cache holds both)."""

    index: IndexCache


@dataclass(frozen=True, slots=True)
class KeepOnly:
    """Every id not in ``ids`` becomes -inf; the kept values are unchanged."""

    index: IndexCache


@dataclass(frozen=True, slots=True)
class ForceToken:
    """Every logit -inf except ``token_id``, which becomes 0.0 unless it was -inf (masks are kept)."""

    token_id: int


RowOp = Union[MaskIds, AddBias, KeepOnly, ForceToken]
ROW_OPS = (MaskIds, AddBias, KeepOnly, ForceToken)


def is_restrictive(op: RowOp) -> bool:
    """Whether ``op`` leaves only a few ids finite (so a row can end up with none)."""
    return isinstance(op, (ForceToken, KeepOnly))


@runtime_checkable
class PlannedProcessor(Protocol):
    """A processor whose step is described by a ``RowOp`` computed from the history alone."""

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None: ...


def check_op(op: RowOp, width: int) -> None:
    """Raise ``IndexError`` unless every id ``op`` names indexes a row of ``width`` logits; O(1).

    Guards ops from plug-in and ``python`` processors (built-in kinds are bounded when realized)
    before they reach a batched tensor op, where an error would hit every request of the batch."""
    if isinstance(op, ForceToken):
        low = high = op.token_id
    else:
        if op.index.low is None or op.index.high is None:  # no ids (both are None together)
            return
        low, high = op.index.low, op.index.high
    if low < 0 or high >= width:
        bad = low if low < 0 else high
        raise IndexError(f"{type(op).__name__} names token id {bad}, outside the logits width {width}")


def force_keeping_masks(row: torch.Tensor, token_id: int) -> None:
    """Force ``token_id`` in the 1-D ``row`` (in place): every other logit -inf, it 0.0 unless it
    was -inf already. No host synchronization."""
    kept = row.narrow(0, token_id, 1).clone()
    row.fill_(NEG_INF)
    row.narrow(0, token_id, 1).copy_(kept.masked_fill_(~torch.isneginf(kept), 0.0))  # NaN too: only -inf is a mask


def apply_op(op: RowOp | None, row: torch.Tensor) -> None:
    """Apply ``op`` to the 1-D ``row`` in place (``None``: nothing)."""
    if op is None:
        return
    if isinstance(op, ForceToken):
        force_keeping_masks(row, op.token_id)
        return
    idx, values = op.index.get(row)
    if isinstance(op, MaskIds):
        row.index_fill_(0, idx, NEG_INF)
    elif isinstance(op, AddBias):
        assert values is not None  # a bias index carries its values
        row.index_add_(0, idx, values)
    else:  # KeepOnly: gather the kept values (allowed-set sized), fill, write them back
        kept = row.index_select(0, idx)
        row.fill_(NEG_INF)
        row.index_copy_(0, idx, kept)


# -- many rows at once ------------------------------------------------------------------------------
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


#: Op type -> ``(logits, [(row, op), ...]) -> None``: the op applied to every listed row at once (each
#: row listed once), with tensors the size of the ids involved, never a vocab-sized one per row.
BATCHED: dict[type, Callable[[torch.Tensor, list[Any]], None]] = {
    MaskIds: _mask,
    AddBias: _add,
    KeepOnly: _keep,
    ForceToken: _force,
}
