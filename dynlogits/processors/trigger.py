"""``trigger``: after the output first ends with the trigger, the phrase is forced once: its processor,
template and resident group (decided on the host from histories, ``modes.SpanDecided``, or on the
device from the span the trigger opens, ``TriggerTables``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.trigger import Trigger, TriggerSpec

from .base import RealizeContext
from .device_thinking import CLOSED, PHRASE, SettledForcing, SpanTables
from .modes import ScopableForcing, SpanDecided
from .ops import ForceToken, RowOp, apply_op
from .slots import SlotTable, Template
from .spans import PLACEHOLDER, SpanScanner

__all__ = ["KIND", "TriggerGroup", "TriggerProcessor", "TriggerTables", "TriggerTemplate", "factory"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = TriggerSpec | Trigger

KIND = "trigger"


class TriggerGroup(ScopableForcing, SettledForcing, SpanDecided):
    """``trigger`` on the resident path: each row's processor decides on the host where the adapter
    has histories (vLLM V1), else ``DeviceThinking`` from the span the trigger opens (``TriggerTables``).
    Scoped to a phase (``scope.ScopedSpan``): a row out of phase (``neutral_history``) forces nothing,
    its processor untouched; without histories the trigger's span restarts at each stretch."""


class TriggerTables(SpanTables):
    """``trigger`` followed on the device: a span the trigger opens in the generated tokens and that
    never closes (its end is the placeholder, never matched); a row ``k`` tokens into it is forced
    to ``phrase[k]`` while ``k`` is within the phrase."""

    in_prompt = False  # a trigger is matched in the generated tokens only, as ``TriggerProcessor``
    closes = False  # it fires once: the span never closes
    rule = PHRASE  # ``decide`` in the fused advance at a step without drafts

    def __init__(self, num_slots: int, device: torch.device) -> None:
        super().__init__(num_slots, device)
        self.phrase = self.table()
        self.phrase_len = self.table()

    def delimiters(self, template: TriggerTemplate) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return template.trigger, (PLACEHOLDER,)

    def forced(self) -> tuple[SlotTable, SlotTable]:
        return self.phrase, self.phrase_len

    def set(self, slot: int, template: TriggerTemplate | None) -> None:
        super().set(slot, template)
        if template is not None:
            self.phrase.set(slot, template.phrase)
            self.phrase_len.set(slot, [len(template.phrase)])

    def host_span(self, processor: Any, history: Sequence[int]) -> int | None:
        return processor.fired_at(history)

    def decide(self, slots: torch.Tensor, span: torch.Tensor, generated: torch.Tensor, valid: torch.Tensor,
               row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        phrase = self.phrase.dev[slots]
        k = generated - span
        fire = valid & (span != CLOSED) & (k < self.phrase_len.dev[slots, 0])
        token = phrase.gather(1, k.clamp(0, phrase.shape[1] - 1)[:, None])[:, 0]
        return torch.where(fire, token, torch.full_like(token, -1))


@dataclass(frozen=True, slots=True)
class TriggerTemplate(Template):
    """Force ``phrase`` once after the output first ends with ``trigger`` (decided per row)."""

    trigger: tuple[int, ...]
    phrase: tuple[int, ...]
    group: ClassVar[type[TriggerGroup]] = TriggerGroup
    reads_tokens: ClassVar[bool] = True
    device_spans: ClassVar[type[TriggerTables]] = TriggerTables


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


def factory(entry: Entry, ctx: RealizeContext) -> TriggerProcessor:
    """A fresh processor for one ``trigger`` entry (resolved: token ids)."""
    return TriggerProcessor(entry.trigger_token_ids, entry.phrase_token_ids)
