"""Operator-side ``python`` factories the kit allow-lists for its own checks; all stateless.

``raise_after(after)`` raises once ``after`` tokens were generated; ``ban_id(token_id)`` bans one
id as a row operation, possibly beyond the logits width (a plug-in bug); ``scale(scale)`` multiplies
the row (a well-behaved opaque processor); ``keep_only(token_ids)`` masks every other id (an opaque
restriction). ``dynlogits.testing.plugin_kinds`` ships the faulty ones as plug-in kinds too."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynlogits.processors.base import IndexCache
from dynlogits.processors.ops import MaskIds, RowOp, apply_op

__all__ = ["BAN_ID_FACTORY", "KEEP_ONLY_FACTORY", "RAISE_AFTER_FACTORY", "SCALE_FACTORY", "ban_id", "keep_only",
           "raise_after", "scale"]

RAISE_AFTER_FACTORY = "dynlogits.testing.faults:raise_after"
SCALE_FACTORY = "dynlogits.testing.faults:scale"
BAN_ID_FACTORY = "dynlogits.testing.faults:ban_id"
KEEP_ONLY_FACTORY = "dynlogits.testing.faults:keep_only"


class RaiseAfter:
    """Raises ``RuntimeError`` once ``after`` tokens were generated; does nothing before."""

    def __init__(self, after: int) -> None:
        self.after = after

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        if len(input_ids) >= self.after:
            raise RuntimeError(f"injected fault after {self.after} tokens")


class Scale:
    """``row *= factor`` every step."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        logits.mul_(self.factor)


class BanId:
    """Bans ``token_id`` every step, described as a ``MaskIds`` row operation (batched path)."""

    def __init__(self, token_id: int) -> None:
        self._index = IndexCache([token_id])

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        return MaskIds(self._index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def ban_id(token_id: int) -> BanId:
    return BanId(token_id)


def raise_after(after: int = 1) -> RaiseAfter:
    return RaiseAfter(after)


def scale(scale: float = 2.0) -> Scale:
    return Scale(scale)


class KeepOnly:
    """Restricts its row to ``token_ids`` by writing ``-inf`` everywhere else (an opaque processor,
    so the adapter cannot know which ids it kept: its row is checked whole)."""

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = list(token_ids)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        index = torch.tensor(self.token_ids, dtype=torch.long, device=logits.device)
        kept = logits.index_select(0, index)
        logits.fill_(float("-inf"))
        logits.index_copy_(0, index, kept)


def keep_only(token_ids: Sequence[int]) -> KeepOnly:
    return KeepOnly(token_ids)
