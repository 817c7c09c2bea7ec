"""The Triton kernel of the ``no_repeat_ngram`` kind under Model Runner V2: every row's decision
from the engine's token matrix and its bans written, one launch (``ban_``), exactly what
``processors.no_repeat_ngram_device``'s host implementation (``ban_host``) and its eager device path
write. Triton is imported when ``kernels()`` is first called (by the CUDA implementation, or a test
that set ``TRITON_INTERPRET=1`` first); this module imports nothing from the rest of the package but ``kernels.variants``.

One program per row ``r`` and block of ``BLOCK`` followers (position ``p = pos[r]``, slot
``slot_of_row[r]``, its ``params`` row: the history's first position ``start``, the size ``n``, the
first position a row decides at, the slot within the engine's; with a per-row ``floor``, ``start``
is ``max(start, floor[r])``: a scoped entry's stretch). Position ``q``'s token is the draft fed ``p - q`` rows before ``r``
(``input_ids``) where ``p - q <= local_pos[r]``, else ``tokens[slot, q]``; it counts where ``q >=
start`` and the token is ``>= 0`` (a placeholder never matches). For each follower ``f`` of the
window's last ``width - size + 1`` positions (``size``: the tables' largest), the token at ``f`` is
banned (``-inf`` stored in the row of ``logits``) where it counts, lies below the logits' width and
the ``n - 1`` tokens before ``f`` count and equal the row's last ``n - 1``. The grid is ``rows x
ceil((width - size + 1) / BLOCK)`` (host integers: no sync); the tail is re-read per lane (cached
loads), so no cross-lane shuffles."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .variants import launch_variant

__all__ = ["BLOCK", "ban_", "kernels", "launch_args", "variant"]

#: followers per program (a power of two)
BLOCK = 128


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _no_repeat_ngram_triton

    return _no_repeat_ngram_triton


def ban_(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor, params: torch.Tensor,
         input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, floor: torch.Tensor | None, width: int,
         size: int) -> None:
    """``-inf`` in ``logits`` (``[rows, vocab]``) at every id each row's history bans (module doc):
    ``tokens`` ``[slots, max_len]``, ``pos`` and ``slot_of_row`` ``[rows]``, ``params`` ``[slots, 4]``
    int64 (contiguous rows), ``input_ids`` and ``local_pos`` both or neither (drafts), ``floor``
    ``[rows]`` int64 or ``None``. One launch, none for zero rows; no sync."""
    rows = pos.shape[0]
    if rows == 0:
        return
    assert params.dtype == torch.int64 and params.stride(1) == 1, "params: int64 rows"
    args, constexprs = launch_args(logits, tokens, pos, slot_of_row, params, input_ids, local_pos, floor, width, size)
    kernels().ban_rows[(rows, (width - size + 1 + BLOCK - 1) // BLOCK)](*args, **constexprs)


def launch_args(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
                params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                floor: torch.Tensor | None, width: int, size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``ban_rows``' positional arguments and constexprs for ``ban_``'s arguments (the launch and
    its off-step compile, ``variant``, take the same)."""
    drafts = input_ids is not None and local_pos is not None
    args = (logits, logits.stride(0), logits.stride(1), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1],
            pos, slot_of_row, params, params.stride(0), input_ids if drafts else pos, local_pos if drafts else pos,
            pos if floor is None else floor, width, logits.shape[1])
    return args, {"SIZE": size, "BLOCK": BLOCK, "HAS_DRAFTS": drafts, "HAS_FLOOR": floor is not None}


def variant(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
            params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
            floor: torch.Tensor | None, width: int, size: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``ban_``'s launch for these arguments."""
    args, constexprs = launch_args(logits, tokens, pos, slot_of_row, params, input_ids, local_pos, floor,
                                           width, size)
    return launch_variant("no_repeat_ngram", lambda: kernels().ban_rows, logits.device, args, constexprs)
