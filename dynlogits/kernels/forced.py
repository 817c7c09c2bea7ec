"""The Triton kernels of ``forced_sequence``'s settle (``processors.forced_settle.settle_``): a
step where no later group can mask the rows, in two launches whatever the batch, exactly what the
eager reference writes. Triton is imported when ``kernels()`` is first called (by the CUDA
implementation, or a test that set ``TRITON_INTERPRET=1`` first); this module imports nothing from
the rest of the package.

Two launches, not one: every row's forced logit must be read before any program writes the row
(programs of one launch are not ordered), so ``decide_rows`` (one program per ``DECIDE_BLOCK``
rows) reads them and writes ``chosen`` and ``dead``, then ``fill_rows`` (one program per member
row and ``FILL_BLOCK`` columns) writes each row whole: ``-inf`` but its target. Grids are host
integers (no sync)."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["DECIDE_BLOCK", "FILL_BLOCK", "WIDTH_BLOCK", "kernels", "pick_settle_", "settle_"]

#: member rows per ``decide_rows`` program, columns per ``fill_rows`` program (powers of two)
DECIDE_BLOCK = 128
FILL_BLOCK = 1024
#: bounds per row per iteration of ``pick_decide_rows`` (a power of two)
WIDTH_BLOCK = 32


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _forced_triton

    return _forced_triton


def settle_(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
            can_stop: torch.Tensor | None, chosen: torch.Tensor, dead: torch.Tensor) -> None:
    """``processors.forced_settle.settle_``'s contract (``logits`` contiguous ``[batch, vocab]``;
    ``picked``, ``if_dead``, ``chosen`` ``[planes, n]`` int64, ``rows``/``can_stop``/``dead``
    ``[n]``). Two launches, none for zero rows; no sync."""
    n = rows.shape[0]
    if n == 0:
        return
    k = kernels()
    has_stops = can_stop is not None
    stops = can_stop if can_stop is not None else dead
    k.decide_rows[((n + DECIDE_BLOCK - 1) // DECIDE_BLOCK,)](
        logits, picked, picked.stride(0), picked.stride(1), if_dead, if_dead.stride(0), if_dead.stride(1), stops,
        chosen, chosen.stride(0), chosen.stride(1), dead, n, PLANES=picked.shape[0], HAS_STOPS=has_stops,
        BLOCK=DECIDE_BLOCK)
    _fill(logits, rows, chosen, dead, can_stop)


def pick_settle_(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                 values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                 chosen: torch.Tensor, dead: torch.Tensor) -> None:
    """``processors.forced_settle.pick_settle_``'s contract: ``pick_decide_rows`` (the pick and the
    decision), then ``fill_rows``. Two launches, none for zero rows; no sync."""
    n = rows.shape[0]
    if n == 0:
        return
    k = kernels()
    stops = can_stop if can_stop is not None else dead
    k.pick_decide_rows[((n + DECIDE_BLOCK - 1) // DECIDE_BLOCK,)](
        logits, rows, values, bounds, bounds.stride(0), bounds.stride(1), bounds.shape[1], table, table.stride(0),
        table.stride(1), table.stride(2), stops, pick, pick.stride(0), pick.stride(1), chosen, chosen.stride(0),
        chosen.stride(1), dead, n, IDENTITY=identity, HAS_STOPS=can_stop is not None, BLOCK=DECIDE_BLOCK,
        WBLOCK=WIDTH_BLOCK)
    _fill(logits, rows, chosen, dead, can_stop)


def _fill(logits: torch.Tensor, rows: torch.Tensor, chosen: torch.Tensor, dead: torch.Tensor,
          can_stop: torch.Tensor | None) -> None:
    """``fill_rows`` over every member row and block of columns: one launch."""
    vocab = logits.shape[1]
    kernels().fill_rows[(rows.shape[0], (vocab + FILL_BLOCK - 1) // FILL_BLOCK)](
        logits, logits.stride(0), rows, chosen, chosen.stride(1), dead, dead if can_stop is None else can_stop,
        vocab, HAS_STOPS=can_stop is not None, BLOCK=FILL_BLOCK)
