"""``banned_phrases``: a phrase's last token is masked whenever the output ends with the rest of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import IndexCache, RealizeContext
from .ops import MaskIds, RowOp, apply_op

__all__ = ["KIND", "BannedPhrasesProcessor", "factory"]

KIND = "banned_phrases"

#: Distinct sets of ids one request masks, whose index tensors are kept (beyond it, rebuilt).
KEPT_SETS = 64


class BannedPhrasesProcessor:
    """Every step, the last token of each phrase whose other tokens end the output is masked; a
    one-token phrase always. Per step: one lookup per phrase length (the output's last ``k``
    tokens for each ``k`` a phrase needs), never a scan of the history or of every phrase."""

    __slots__ = ("_always", "_after", "_lengths", "_sets")

    def __init__(self, phrases: Sequence[Sequence[int]]) -> None:
        self._always = tuple(sorted({p[0] for p in phrases if len(p) == 1}))
        after: dict[tuple[int, ...], set[int]] = {}
        for phrase in phrases:
            if len(phrase) > 1:
                after.setdefault(tuple(phrase[:-1]), set()).add(phrase[-1])
        self._after = {prefix: tuple(sorted(last)) for prefix, last in after.items()}
        self._lengths = tuple(sorted({len(prefix) for prefix in self._after}))
        self._sets: dict[tuple[int, ...], IndexCache] = {}

    def banned(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks (sorted)."""
        found: set[int] = set(self._always)
        n = len(input_ids)
        for k in self._lengths:
            if k > n:
                break
            last = self._after.get(tuple(input_ids[n - k :]))
            if last:
                found.update(last)
        return tuple(sorted(found))

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        ids = self.banned(input_ids)
        if not ids:
            return None
        index = self._sets.get(ids)
        if index is None:
            if len(self._sets) >= KEPT_SETS:
                self._sets.clear()
            index = self._sets[ids] = IndexCache(ids)
        return MaskIds(index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Any, ctx: RealizeContext) -> BannedPhrasesProcessor:
    """A fresh processor for one ``banned_phrases`` entry (resolved: ``phrases`` only)."""
    return BannedPhrasesProcessor(entry.phrases)
