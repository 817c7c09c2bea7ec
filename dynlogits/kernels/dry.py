"""The Triton kernel of the ``dry`` kind's Model Runner V2 step (``processors.dry_device.fused_lower_``
on CUDA): ``decide`` gives, per row and position of the window, the id after the position and the
logit there lowered by the position's penalty; ``scatter_reduce_`` (``amin``) then writes them, as
``dry_device.lower_rows`` does. Triton is imported when ``kernels()`` is first called (by the CUDA
implementation, or a test that set ``TRITON_INTERPRET=1`` first); this module imports nothing from the
rest of the package but ``kernels.variants``.

One program per (row, ``BLOCK`` positions): the row's slot, position, parameters and breaker limit
(its last ``cap`` columns looked up in the slot's sorted breakers by binary search), then, for every
position at once, the tokens back from it compared with the window's last ones until every position
has mismatched or the limit is reached (a loop with an early exit: typical text stops after a token
or two), then the token after each position, its breaker check, the amount (float64, clamped to the
dtype's largest and rounded through float32 as torch converts it) and the lowered logit (in float32,
float64 for float64 logits: one rounding, as torch's subtraction; past the range the dtype's lowest,
``-inf``, ``+inf`` and NaN kept). A non-member row, or a position that penalizes nothing, gets the
logit unchanged: ``scatter_reduce_`` leaves it as it is.

What the interpreter (``TRITON_INTERPRET=1``, CPU) checks: all of it, bit for bit against the eager
reference (integer work, comparisons, the float64 -> float32 -> dtype roundings and one subtraction
are IEEE operations in numpy as on the GPU); that the compiled kernel does the same on a GPU is checked
there (``python -m dynlogits.testing.cuda.dry_check``, and the kind's probe at its first use)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .variants import launch_variant

__all__ = ["BLOCK", "decide", "kernels", "launch_args", "variant"]

#: positions per program
BLOCK = 128


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _dry_triton

    return _dry_triton


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def decide(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
           input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
           member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor, width: int,
           cap: int, floor: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``logits`` (``[rows, vocab]``, last dim contiguous) and each of its window's first
    ``width - 1`` positions: the id after it (``[rows, width - 1]`` int64) and the logit there
    lowered by its penalty (the logits' dtype). The window is ``TokenWindow``'s (``tokens [slots,
    max_len]``, ``prompt_len``, ``pos``, with drafts ``input_ids`` and ``local_pos``); the tables
    (``params [slots, 4]``, sorted ``singles``, ``amounts``, last dims contiguous) are read at
    ``slot_of_row``; ``1 <= cap <= width``; ``floor`` (int64 per row, or ``None``): a row's window
    starts at ``max(start, floor[r])`` (positions from the prompt's start). One launch."""
    k = kernels()
    rows = pos.shape[0]
    ids = torch.empty(rows, width - 1, dtype=torch.int64, device=logits.device)
    lowered = torch.empty(rows, width - 1, dtype=logits.dtype, device=logits.device)
    if rows == 0 or width < 2:
        return ids, lowered
    for t in (logits, tokens, params, singles, amounts):
        assert t.stride(-1) == 1, "the last dimension must be contiguous"
    args, constexprs = launch_args(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params,
                                   singles, amounts, width, cap, floor, ids, lowered)
    k.decide_rows[(rows, (width - 1 + BLOCK - 1) // BLOCK)](*args, **constexprs)
    return ids, lowered


def launch_args(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor,
                member: torch.Tensor, params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor, width: int,
                cap: int, floor: torch.Tensor | None, ids: torch.Tensor,
                lowered: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``decide_rows``' positional arguments and constexprs for ``decide``'s arguments and its two
    outputs (the launch and its off-step compile, ``variant``, take the same)."""
    drafts = input_ids is not None and local_pos is not None
    flags = member.view(torch.uint8) if member.dtype == torch.bool else member
    f64 = logits.dtype == torch.float64
    largest = 0.0 if f64 else float(torch.finfo(logits.dtype).max)
    args = (logits, logits.stride(0), tokens, tokens.stride(0), tokens.shape[0], prompt_len, prompt_len.stride(0), pos,
            pos.stride(0), input_ids if drafts else pos, input_ids.stride(0) if input_ids is not None and drafts else 0,
            local_pos if drafts else pos, local_pos.stride(0) if local_pos is not None and drafts else 0,
            slot_of_row, slot_of_row.stride(0), flags, flags.stride(0), pos if floor is None else floor,
            0 if floor is None else floor.stride(0), params, params.stride(0), singles, singles.stride(0),
            singles.shape[1], amounts, amounts.stride(0), amounts.shape[1], ids, lowered, ids.stride(0), width, cap,
            largest)
    return args, {"BLOCK": BLOCK, "TAIL": _pow2(cap, 16), "LOG_S": max(1, singles.shape[1].bit_length()),
                  "DRAFTS": drafts, "F64": f64, "BF16": logits.dtype == torch.bfloat16, "HAS_FLOOR": floor is not None}


def variant(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
            input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor,
            params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor, width: int, cap: int,
            floor: torch.Tensor | None) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``decide``'s launch for these arguments (its two
    outputs as meta tensors of their shapes: only their dtypes and strides are read)."""
    rows = max(pos.shape[0], 1)
    ids = torch.empty(rows, max(width - 1, 1), dtype=torch.int64, device="meta")
    lowered = torch.empty(rows, max(width - 1, 1), dtype=logits.dtype, device="meta")
    args, constexprs = launch_args(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member,
                                           params, singles, amounts, width, cap, floor, ids, lowered)
    return launch_variant("dry", lambda: kernels().decide_rows, logits.device, args, constexprs)
