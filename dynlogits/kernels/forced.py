"""The Triton kernels of ``forced_sequence``'s settle (``processors.forced_settle.settle_``): a
step where no later group can mask the rows, in two launches whatever the batch, exactly what the
eager reference writes. Triton is imported when ``kernels()`` is first called (by the CUDA
implementation, or a test that set ``TRITON_INTERPRET=1`` first); this module imports nothing from
the rest of the package but ``kernels.variants``.

Two launches, not one: every row's forced logit must be read before any program writes the row
(programs of one launch are not ordered), so ``decide_rows`` (one program per ``DECIDE_BLOCK``
rows) reads them and writes ``chosen`` and ``dead``, then ``fill_rows`` (one program per member
row and ``FILL_BLOCK`` columns) writes each row whole: ``-inf`` but its target. Grids are host
integers (no sync)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .variants import launch_variant, launches_variant

__all__ = ["DECIDE_BLOCK", "FILL_BLOCK", "WIDTH_BLOCK", "decide_args", "fill_args", "kernels", "pick_decide_args", "pick_settle_", "pick_settle_variant", "settle_", "settle_variant"]

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
    args, constexprs = decide_args(logits, rows, picked, if_dead, can_stop, chosen, dead)
    kernels().decide_rows[((n + DECIDE_BLOCK - 1) // DECIDE_BLOCK,)](*args, **constexprs)
    _fill(logits, rows, chosen, dead, can_stop)


def pick_settle_(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                 values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                 chosen: torch.Tensor, dead: torch.Tensor) -> None:
    """``processors.forced_settle.pick_settle_``'s contract: ``pick_decide_rows`` (the pick and the
    decision), then ``fill_rows``. Two launches, none for zero rows; no sync."""
    n = rows.shape[0]
    if n == 0:
        return
    args, constexprs = pick_decide_args(logits, rows, table, bounds, values, identity, can_stop, pick, chosen, dead)
    kernels().pick_decide_rows[((n + DECIDE_BLOCK - 1) // DECIDE_BLOCK,)](*args, **constexprs)
    _fill(logits, rows, chosen, dead, can_stop)


def _fill(logits: torch.Tensor, rows: torch.Tensor, chosen: torch.Tensor, dead: torch.Tensor,
          can_stop: torch.Tensor | None) -> None:
    """``fill_rows`` over every member row and block of columns: one launch."""
    args, constexprs = fill_args(logits, rows, chosen, dead, can_stop)
    kernels().fill_rows[(rows.shape[0], (logits.shape[1] + FILL_BLOCK - 1) // FILL_BLOCK)](*args, **constexprs)


# Each launch's positional arguments and constexprs (the launch and its off-step compile,
# ``settle_variant`` and ``pick_settle_variant``, take the same).

def decide_args(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
                can_stop: torch.Tensor | None, chosen: torch.Tensor, dead: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``decide_rows``' arguments for ``settle_``'s."""
    stops = can_stop if can_stop is not None else dead
    args = (logits, picked, picked.stride(0), picked.stride(1), if_dead, if_dead.stride(0), if_dead.stride(1), stops,
            chosen, chosen.stride(0), chosen.stride(1), dead, rows.shape[0])
    return args, {"PLANES": picked.shape[0], "HAS_STOPS": can_stop is not None, "BLOCK": DECIDE_BLOCK}


def pick_decide_args(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                     values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                     chosen: torch.Tensor, dead: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``pick_decide_rows``' arguments for ``pick_settle_``'s."""
    stops = can_stop if can_stop is not None else dead
    args = (logits, rows, values, bounds, bounds.stride(0), bounds.stride(1), bounds.shape[1], table, table.stride(0),
            table.stride(1), table.stride(2), stops, pick, pick.stride(0), pick.stride(1), chosen, chosen.stride(0),
            chosen.stride(1), dead, rows.shape[0])
    return args, {"IDENTITY": identity, "HAS_STOPS": can_stop is not None, "BLOCK": DECIDE_BLOCK, "WBLOCK": WIDTH_BLOCK}


def fill_args(logits: torch.Tensor, rows: torch.Tensor, chosen: torch.Tensor, dead: torch.Tensor,
              can_stop: torch.Tensor | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fill_rows``' arguments for ``settle_``'s and ``pick_settle_``'s."""
    args = (logits, logits.stride(0), rows, chosen, chosen.stride(1), dead, dead if can_stop is None else can_stop,
            logits.shape[1])
    return args, {"HAS_STOPS": can_stop is not None, "BLOCK": FILL_BLOCK}


def settle_variant(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
                   can_stop: torch.Tensor | None, chosen: torch.Tensor,
                   dead: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of ``settle_``'s two launches (``decide_rows``,
    ``fill_rows``) for these arguments."""
    decide = decide_args(logits, rows, picked, if_dead, can_stop, chosen, dead)
    fill = fill_args(logits, rows, chosen, dead, can_stop)
    return launches_variant([
        launch_variant("forced.decide_rows", lambda: kernels().decide_rows, logits.device, *decide),
        launch_variant("forced.fill_rows", lambda: kernels().fill_rows, logits.device, *fill)])


def pick_settle_variant(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                        values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                        chosen: torch.Tensor, dead: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of ``pick_settle_``'s two launches
    (``pick_decide_rows``, ``fill_rows``) for these arguments."""
    decide = pick_decide_args(logits, rows, table, bounds, values, identity, can_stop, pick, chosen, dead)
    fill = fill_args(logits, rows, chosen, dead, can_stop)
    return launches_variant([
        launch_variant("forced.pick_decide_rows", lambda: kernels().pick_decide_rows, logits.device, *decide),
        launch_variant("forced.fill_rows", lambda: kernels().fill_rows, logits.device, *fill)])
