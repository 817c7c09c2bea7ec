"""``trigger``: after the output first ends with the trigger, the phrase is forced once: its processor,
template and resident group (decided on the host, ``HostForcingGroup``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import RealizeContext
from .ops import ForceToken, RowOp, apply_op
from .slots import HostForcingGroup, Template
from .spans import PLACEHOLDER, SpanScanner

__all__ = ["KIND", "TriggerGroup", "TriggerProcessor", "TriggerTemplate", "factory"]

KIND = "trigger"


class TriggerGroup(HostForcingGroup):
    """``trigger`` on the resident path: each row's processor decides on the host (vLLM V1)."""


@dataclass(frozen=True, slots=True)
class TriggerTemplate(Template):
    """Force ``phrase`` once after the output first ends with ``trigger`` (decided per row)."""

    trigger: tuple[int, ...]
    phrase: tuple[int, ...]
    group: ClassVar[type[TriggerGroup]] = TriggerGroup
    reads_tokens: ClassVar[bool] = True


class TriggerProcessor:
    """The first time the generated tokens end with ``trigger`` (right before generated position
    ``e``), steps ``e .. e + len(phrase) - 1`` force ``phrase`` in order; later occurrences do nothing.

    The first occurrence is followed as a span that opens at the trigger and never closes
    (``SpanScanner`` with the placeholder, which is never matched, as its end): each call scans only
    unseen tokens, and a history whose tail changed (preemption, rejected drafts) rolls back to where
    it still agrees, so an occurrence the history no longer holds is forgotten."""

    __slots__ = ("trigger", "phrase", "template", "_scanner")

    def __init__(self, trigger: Sequence[int], phrase: Sequence[int]) -> None:
        self.trigger, self.phrase = tuple(trigger), tuple(phrase)
        self.template = TriggerTemplate(self.trigger, self.phrase)
        self._scanner = SpanScanner(self.trigger, (PLACEHOLDER,))

    def fired_at(self, input_ids: Sequence[int]) -> int | None:
        """The generated position right after the trigger's first occurrence (``None``: not yet)."""
        return self._scanner.span(input_ids)

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
