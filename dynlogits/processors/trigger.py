"""``trigger``: after the output first ends with the trigger, the phrase is forced once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .base import RealizeContext
from .ops import ForceToken, RowOp, apply_op

__all__ = ["KIND", "TriggerProcessor", "factory"]

KIND = "trigger"


class TriggerProcessor:
    """The first time the output ends with ``trigger`` (at generated position ``e``), the next
    ``len(phrase)`` steps force ``phrase`` in order; later occurrences do nothing. The first
    occurrence is found once and kept while the history still agrees with it (a shorter or changed
    history, after preemption or rejected drafts, is searched again)."""

    __slots__ = ("trigger", "phrase", "_found", "_searched")

    def __init__(self, trigger: Sequence[int], phrase: Sequence[int]) -> None:
        self.trigger, self.phrase = tuple(trigger), tuple(phrase)
        self._found: tuple[int, tuple[int, ...]] | None = None  # (end position, the tokens that matched)
        self._searched = 0  # history positions already searched without a match

    def fired_at(self, input_ids: Sequence[int]) -> int | None:
        """Where the trigger's first occurrence ends (``None``: not yet)."""
        t = len(self.trigger)
        if self._found is not None:
            end, seen = self._found
            if len(input_ids) >= end and tuple(input_ids[end - t : end]) == seen:
                return end
            self._found, self._searched = None, 0
        self._searched = min(self._searched, len(input_ids))
        for end in range(max(self._searched, t), len(input_ids) + 1):
            if tuple(input_ids[end - t : end]) == self.trigger:
                self._found = (end, self.trigger)
                return end
        self._searched = max(0, len(input_ids) - t + 1)
        return None

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        end = self.fired_at(input_ids)
        if end is None:
            return None
        k = len(input_ids) - end
        return ForceToken(self.phrase[k]) if k < len(self.phrase) else None

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Any, ctx: RealizeContext) -> TriggerProcessor:
    """A fresh processor for one ``trigger`` entry (resolved: token ids)."""
    return TriggerProcessor(entry.trigger_token_ids, entry.phrase_token_ids)
