"""Each kind's ``(variant, compile)`` pair (``dynlogits.kernels.variants.launch_variant``) for its
fused op's launch arguments: the kernel's argument list repeated from the kind's launch (each
checked against it by ``tests/kernels/test_off_step_compile.py``), the kernels' modules imported
at the call (Triton only on the compile thread)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from .variants import launch_variant

__all__ = ["banned_phrases", "no_repeat_ngram"]


def no_repeat_ngram(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
                    params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                    floor: torch.Tensor | None, width: int, size: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.no_repeat_ngram.ban_``'s launch for these arguments
    (its argument list, checked against the launch by ``tests/kernels/test_off_step_compile.py``)."""
    drafts = input_ids is not None and local_pos is not None
    ids = input_ids if drafts and input_ids is not None else pos
    local = local_pos if drafts and local_pos is not None else pos
    args = (logits, logits.stride(0), logits.stride(1), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1], pos,
            slot_of_row, params, params.stride(0), ids, local, pos if floor is None else floor, width, logits.shape[1])

    def kernel() -> Any:
        from . import no_repeat_ngram as kernels

        return kernels.kernels().ban_rows

    from .no_repeat_ngram import BLOCK

    return launch_variant("no_repeat_ngram", kernel, logits.device, args,
                          {"SIZE": size, "BLOCK": BLOCK, "HAS_DRAFTS": drafts, "HAS_FLOOR": floor is not None})


def banned_phrases(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                   slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
                   need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                   floor: torch.Tensor | None, entries: int, width: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.banned_phrases.launch`` for these arguments (its
    argument list, checked against the launch by ``tests/kernels/test_off_step_compile.py``)."""
    from . import banned_phrases as kernels

    drafts = input_ids is not None and local_pos is not None
    ids = input_ids if drafts and input_ids is not None else pos
    local = local_pos if drafts and local_pos is not None else pos
    args = (logits, logits.stride(0), logits.stride(1), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1],
            tokens.shape[0], prompt_len, pos, slot_of_row, member.view(torch.uint8), prefix, prefix.stride(0), bans,
            bans.stride(0), need, need.stride(0), ids, local, pos if floor is None else floor, entries, width,
            logits.shape[1])
    return launch_variant("banned_phrases", lambda: kernels.kernels().ban_rows, logits.device, args,
                          {"BLOCK_E": kernels.BLOCK_E, "BLOCK_W": kernels.block_width(width), "HAS_DRAFTS": drafts,
                           "HAS_FLOOR": floor is not None})
