"""``thinking_budget``: close a thinking span once it has used its token budget: the host processor,
template, resident group and the per-slot tables the device decider keeps for it (``ThinkingTables``).

The span rule is ``docs/specs.md``'s. Whether to force depends on the tokens, so the resident
group's step is decided per row (``modes.SpanDecided``): on the host from the live history
(``ThinkingBudgetProcessor.row_op``, vLLM V1) or on the device
(``dynlogits.processors.device_thinking.DeviceThinking``, Model Runner V2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.thinking_budget import ThinkingBudget, ThinkingBudgetSpec

from .base import RealizeContext
from .device_thinking import ANCHOR, BIG, CLOSED, DUE, NEVER, OUT, SettledForcing, SpanTables
from .modes import ScopableForcing, SpanDecided
from .ops import ForceToken, RowOp, apply_op
from .slots import SlotTable, Template
from .spans import ROLLBACK, SpanScanner

__all__ = ["CLOSED", "KIND", "ROLLBACK", "ThinkingBudgetGroup", "ThinkingBudgetProcessor", "ThinkingBudgetTemplate",
           "ThinkingTables", "factory", "restarts_exactly"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = ThinkingBudgetSpec | ThinkingBudget

KIND = "thinking_budget"


class ThinkingBudgetProcessor:
    """Force ``end_token_ids`` once ``budget`` tokens follow ``start_token_ids`` in an open span.

    Spans are ``SpanScanner``'s, followed from the request's ``prompt`` on: a span the prompt left
    open is open at the first generated token and its prompt tokens count against the budget (as
    vLLM's ``thinking_token_budget``). Once a span holds ``budget`` tokens, the next end token is
    forced each step (continuing an end sequence already begun) until it closes; a later start
    sequence opens a new span with a fresh budget. A step costs O(new tokens + ``ROLLBACK``)."""

    __slots__ = ("start", "end", "budget", "template", "scanner")

    def __init__(self, start_token_ids: Sequence[int], end_token_ids: Sequence[int], budget: int,
                 prompt: Sequence[int] = ()) -> None:
        self.start = tuple(start_token_ids)
        self.end = tuple(end_token_ids)
        self.budget = budget
        self.scanner = SpanScanner(self.start, self.end, prompt)
        tail = tuple(prompt[len(prompt) - self.scanner.prompt_tail :])
        self.template = ThinkingBudgetTemplate(self.start, self.end, budget, self.scanner.initial,
                                               self.scanner.prompt_tail,
                                               restarts_exactly(tail, self.start, self.end, self.scanner.initial))

    def span(self, ids: Sequence[int]) -> int | None:
        """Where the open span began after ``ids`` (generated positions, ``<= 0`` in the prompt);
        ``None``: no open span."""
        return self.scanner.span(ids)

    def _end_progress(self, ids: Sequence[int], span_len: int) -> int:
        """How many leading end tokens the span already ends with."""
        for k in range(min(len(self.end) - 1, span_len), 0, -1):
            if self.scanner.recent(ids, k) == self.end[:k]:
                return k
        return 0

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        span = self.scanner.span(input_ids)
        if span is None:
            return None
        span_len = len(input_ids) - span
        if span_len < self.budget:
            return None
        return ForceToken(self.end[self._end_progress(input_ids, span_len)])

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def restarts_exactly(tail: Sequence[int], start: Sequence[int], end: Sequence[int], initial: int | None) -> bool:
    """Whether the automaton restarted at a scoped stretch's start (``ThinkingTables.restart_state``)
    follows what the hosted inner processor, fed the stretch alone, sees: no delimiter straddles the
    stretch's start on either side. Hosted, the prompt's ``tail`` stands before every stretch: it
    ends with no proper prefix of ``start`` or ``end``. On the device the tokens really before it
    do: where the prompt left a span open (``initial``), an ``end`` inside the stretch is no part of
    a ``start`` reaching back before it (``end`` at no offset ``1 .. len(start) - len(end) - 1`` of it)."""
    start, end, tail = tuple(start), tuple(end), tuple(tail)
    for seq in (start, end):
        if any(tail[len(tail) - j :] == seq[:j] for j in range(1, min(len(tail), len(seq) - 1) + 1)):
            return False
    return initial is None or all(start[o : o + len(end)] != end for o in range(1, len(start) - len(end)))


class ThinkingBudgetGroup(ScopableForcing, SettledForcing, SpanDecided):
    """``thinking_budget``: whether and what to force depends on the tokens written, decided per
    row (the end token to force, ``-1`` for none): on the host from the live history (V1 runner),
    or on the device (``DeviceThinking`` with ``ThinkingTables``, Model Runner V2). Scoped to a phase
    (``scope.ScopedSpan``): a row in phase is decided from its stretch alone (the processor's
    scanner, built with the prompt, fed it), one out of phase (``neutral_history``) forces nothing;
    without histories the automaton restarts at each stretch (``ThinkingTables.restart_state``),
    where that is exact (``ThinkingBudgetTemplate.restarts_exactly``), else the request is hosted."""

    positional = False  # a row left with no token reports no output position


@dataclass(frozen=True, slots=True)
class ThinkingBudgetTemplate(Template):
    """Force the next end token once a span holds ``budget`` tokens (decided per row)."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    budget: int
    #: where the span the request's prompt left open began (generated positions, ``<= 0``), or ``None``
    initial: int | None = None
    #: how many of the prompt's last tokens a start sequence may cover (``SpanScanner.prompt_tail``)
    prompt_tail: int = 0
    #: scoped, whether the device's automaton restarted at each stretch is the hosted path's
    #: (``restarts_exactly``; else a scoped entry's request is hosted where histories are not on the host)
    restarts_exactly: bool = True
    group: ClassVar[type[ThinkingBudgetGroup]] = ThinkingBudgetGroup
    reads_tokens: ClassVar[bool] = True


def factory(entry: Entry, ctx: RealizeContext) -> ThinkingBudgetProcessor:
    """A fresh processor for one ``thinking_budget`` entry: its own delimiters, else the request's
    reasoning delimiters (``ctx.reasoning``); spans followed from the request's prompt on."""
    start, end = entry.start_token_ids, entry.end_token_ids
    if start is None or end is None:
        if ctx.reasoning is None:
            raise ValueError("thinking_budget has no delimiters of its own (start/end) and the request has no "
                             "reasoning delimiters (a reasoning entry, or the deployment's reasoning:)")
        start = ctx.reasoning[0] if start is None else start
        end = ctx.reasoning[1] if end is None else end
    return ThinkingBudgetProcessor(start, end, entry.budget, ctx.prompt_ids)


class ThinkingTables(SpanTables):
    """``thinking_budget``'s: its delimiters and budget. The state's ``OUT`` is the generated count at
    which the open span has spent its budget (its start plus the budget; ``NEVER`` and beyond
    outside a span), so a row fires where its generated count reaches it."""

    scale = (1, 1, 0, 1)  # OUT: the budget, from the position the span opened at
    rule = DUE  # ``decide_state`` in the fused advance at a step without drafts

    def __init__(self, num_slots: int, device: torch.device) -> None:
        super().__init__(num_slots, device)
        self.budget = self.table()

    def delimiters(self, template: ThinkingBudgetTemplate) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return template.start, template.end

    def initial(self, template: ThinkingBudgetTemplate) -> int:
        return CLOSED if template.initial is None else template.initial

    def outs(self, template: ThinkingBudgetTemplate) -> tuple[int, int]:
        return NEVER, template.budget

    def forced(self) -> tuple[SlotTable, SlotTable]:
        return self.end, self.end_len

    @classmethod
    def restarts_exactly(cls, template: ThinkingBudgetTemplate) -> bool:
        """Where no delimiter can straddle a stretch's start (``restarts_exactly``, the function)."""
        return template.restarts_exactly

    def restart_state(self, template: ThinkingBudgetTemplate) -> list[int]:
        """The state a scoped entry's automaton restarts in at each stretch's start, as position 0
        (``stretch_spans.StretchSpans`` adds the start by ``scale``): the hosted inner processor's
        scanner, built with the prompt, fed the stretch alone, starts each as after the prompt: a span
        the prompt left open is open, its prompt tokens counted against the budget (``OUT``: the
        budget from ``initial``). No delimiter straddles the start (``restarts_exactly``): the looked-for
        sequence begins at 0 at the earliest (``KEY``), and an end already begun is read within the
        stretch only (``ANCHOR`` 0)."""
        start, end = self.delimiters(template)
        span = self.initial(template)
        if span == CLOSED:
            return [BIG * len(start) + len(start), 0, 0, NEVER]
        return [BIG * len(end) + len(end), 0, 1, template.budget + span]

    def set(self, slot: int, template: ThinkingBudgetTemplate | None) -> None:
        super().set(slot, template)
        if template is not None:
            self.budget.set(slot, [template.budget])

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The budget rule: once the span holds ``budget`` tokens, the next end token (the first one
        the history does not already end with)."""
        count = generated()
        fire = valid & (count >= (self.state[slots, OUT] if state is None else state[:, OUT]))
        end = self.end.dev
        if end.shape[1] == 1:  # one-token ends: nothing begun to continue
            return torch.where(fire, end[slots, 0], self.no_token)
        rows = self.state[slots] if state is None else state
        return self._continued(slots, count - rows[:, ANCHOR], count, fire, row_tokens)

    def _continued(self, slots: torch.Tensor, span_len: torch.Tensor, generated: torch.Tensor, fire: torch.Tensor,
                   row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The end token each firing row is due: past how many leading end tokens the history
        already ends with (continue, do not restart)."""
        end, end_len = self.end.dev[slots], self.end_len.dev[slots, 0]
        progress = torch.zeros_like(generated)
        width = end.shape[1]
        last = row_tokens(slots, generated[:, None] - width + 1 + torch.arange(width - 1, device=slots.device)[None, :])
        for k in range(1, width):  # the last k tokens == end[:k]
            tail = last[:, width - 1 - k :]
            match = (tail == end[:, :k]).all(1) & (k < end_len) & (k <= span_len)
            progress = torch.where(match, torch.full_like(progress, k), progress)
        token = end.gather(1, progress[:, None])[:, 0]
        return torch.where(fire, token, torch.full_like(token, -1))

    def decide(self, slots: torch.Tensor, span: torch.Tensor, generated: torch.Tensor, valid: torch.Tensor,
               row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The budget rule from a span start (``CLOSED``: none)."""
        span_len = generated - span
        fire = valid & (span != CLOSED) & (span_len >= self.budget.dev[slots, 0])
        return self._continued(slots, span_len, generated, fire, row_tokens)


ThinkingBudgetTemplate.device_spans = ThinkingTables  # defined after the template it decides
