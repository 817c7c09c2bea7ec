"""Row operations: what a built-in processor does to its row at one step, as data.

A built-in processor's ``row_op(input_ids)`` returns one ``RowOp`` (or ``None`` for "leave the row
alone") instead of editing the row itself, so an adapter can apply the same operation to every
row of a batch that needs it with a few tensor ops (``dynlogits.sdk.plans``) rather than a Python
loop over rows. ``apply_op`` applies one op to one 1-D row; the processors' own ``__call__`` is
``apply_op(row_op(...))``, so the per-row and the batched paths share one definition.

**Masks are never undone.** ``ForceToken`` makes its token the only possible choice *unless it
is already masked* (``-inf``: by the engine's grammar bitmask, or by an earlier entry); then the
whole row is ``-inf`` and the request cannot continue. ``witness`` names, for the ops that
restrict a row to a few ids (``ForceToken``, ``KeepOnly``), the ids that must keep a finite
logit; when none does after a request's ops, the request is failed with that reason
(``dynlogits.sdk.guard``) instead of sampling from an all ``-inf`` row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

import torch

from .base import IndexCache

__all__ = [
    "AddBias",
    "ForceToken",
    "KeepOnly",
    "MaskIds",
    "PlannedProcessor",
    "RowOp",
    "apply_op",
    "check_op",
    "force_keeping_masks",
    "is_restrictive",
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
    """Raise ``IndexError`` unless every id ``op`` names indexes a row of ``width`` logits.

    Built-in kinds are bounded when realized; this guards ops from plug-in and ``python``
    processors, which would otherwise reach a batched tensor op (an error there, or a device
    assert on CUDA, would hit every request of the batch). O(1): the bounds are precomputed.
    """
    if isinstance(op, ForceToken):
        low = high = op.token_id
    else:
        low, high = op.index.low, op.index.high
        if low is None:
            return
    if low < 0 or high >= width:  # type: ignore[operator]
        bad = low if low < 0 else high  # type: ignore[operator]
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
        row.index_add_(0, idx, values)  # type: ignore[arg-type]
    else:  # KeepOnly: gather the kept values (allowed-set sized), fill, write them back
        kept = row.index_select(0, idx)
        row.fill_(NEG_INF)
        row.index_copy_(0, idx, kept)
