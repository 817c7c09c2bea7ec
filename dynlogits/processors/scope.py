"""``scope``: an entry that applies in one phase of a request only (``docs/specs.md``, "scope").

With reasoning delimiters in force (a ``reasoning`` entry, or the deployment's), every step of a
request is in its *reasoning* phase (inside a span the delimiters open, the prompt's included) or
its *answer* phase; without them every step is an answer step. An entry scoped to a phase acts
only at that phase's steps, and sees as its history the tokens generated since the current stretch
of that phase began (a forced sequence scoped to ``answer`` starts at the answer's first token).

``Phases`` follows one request (one ``SpanScanner``, shared by its scoped entries); ``scoped``
wraps a processor. With reasoning delimiters in force, a scoped entry is resident (``_resident_inner``)
where its kind is:

* a group decided by nobody, whose step reads no tokens (``banned_tokens``, ``logit_bias``,
  ``allowed_tokens``, and the positional ``min_tokens`` and ``forced_sequence``): ``ScopedTemplate``,
  ``ScopedGroup``. Each row's phase, and how many tokens its phase's stretch holds, is decided on
  the host from its history where the adapter has histories (the V1 runner's live lists), else on
  the device by ``DeviceThinking`` (``ScopeTables``: the request's delimiters, followed from the
  prompt on; the stretch's start is the state's ``ANCHOR``), and the inner kind's step runs,
  gathered, on the rows in the entry's phase only, a positional kind at the stretch's counts
  (``StepInputs.generated`` replaced);
* a decided group that opts in (``DecidedGroup.scopable``: ``no_repeat_ngram`` and ``dry`` without
  ``include_prompt``, ``banned_phrases``, ``multiple_choice``): ``ScopedDecided`` (``dry``'s
  processor has no ``row_op``: ``_ScopedResidentCalled``, called where hosted). With host histories
  the inner group decides every member row, in phase from its stretch (``_own``), out of it from the
  kind's ``neutral_history`` (nothing; ``banned_phrases`` and ``multiple_choice`` tell it apart by
  identity, ``modes.OUT_OF_PHASE``: one-token phrases are masked in phase only, a choice's row out
  of phase is left whole and never counted dead); without, where the adapter passes a
  ``TokenWindow`` and the kind decides from it from a floor on (``WindowDecided.floored``:
  ``no_repeat_ngram`` up to ``MAX_DEVICE_SIZE``, any ``max_tokens``; ``banned_phrases`` and
  ``multiple_choice`` whose tables fit, as unscoped; ``dry`` with single-token breakers and a cap
  up to ``MAX_DEVICE_CAP``), ``DeviceThinking`` gives each row's floor (``FloorScopeTables``: its
  stretch's start, the state's ``ANCHOR``; past every position for a row out of phase, or after a
  placeholder draft) and the inner kind decides from the engine's token matrix in place, drafts
  included, no position below the floor counted (``WindowDecided.apply_floored``: the kind's one
  fused op, ``no_repeat_ngram_ban_``, ``banned_phrases_ban_`` or ``dry_lower_``, with the floors;
  ``multiple_choice`` reads its rows' first tokens from their floors); else its request is hosted
  there. A floor is a position like any other, so one inside the drafts (a delimiter among them) is
  exact too. ``banned_phrases``' and ``multiple_choice``'s window tables (as large as their members'
  phrase sets and tries) are written from the first window step on only
  (``ScopedDecided._from_window``): with host histories nobody reads them.

A scoped ``deadline`` is ``ScopedClock`` (its clock on the host, its phase from the live list or
``DeviceThinking``); a scoped ``trigger`` or ``thinking_budget`` is ``ScopedSpan``: with host
histories decided from its stretch (out of phase from ``OUT_OF_PHASE``: nothing), without its own
automaton restarted at each stretch (``ScopedSpanTables``, ``stretch_spans.StretchSpans``) in the
state the hosted inner processor starts what it is fed in (``SpanTables.restart_state``): a ``trigger``'s looking
for its start from the stretch's first token; a ``thinking_budget``'s, whose scanner was built with
the prompt, as after the prompt (a span the prompt left open open again, its prompt tokens counted
against the budget; ``ThinkingTables.restart_state``), exact where no delimiter can straddle a
stretch's start (``thinking_budget.restarts_exactly``), else its request is hosted there.
Any other scoped entry (a ``python`` kind; a scoped ``watermark`` is refused at admission) has no
template: its request runs on the hosted path, the oracle the resident paths equal bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast, overload

import numpy as np
import torch

from .device_thinking import ANCHOR, CLOSED, FLOOR, NEVER, OUT, SEL, STRETCH, SpanTables
from .modes import ClockDecided, DecidedGroup, Decider, SpanDecided, SpanWindowDecided, WindowDecided
from .slots import Dead, GatheredRows, Group, ListedRows, StepInputs, Template
from .spans import SpanScanner
from .stretch_spans import StretchSpans
from .uploads import StepUpload
from .window import TokenWindow

__all__ = ["FloorScopeTables", "Phases", "Reasoning", "ScopeTables", "ScopedClock", "ScopedDecided", "ScopedGroup",
           "ScopedSpan", "ScopedSpanTables", "ScopedTemplate", "StretchScopeTables", "scoped"]

#: A request's reasoning delimiters: ``(start token ids, end token ids)``.
Reasoning = tuple[tuple[int, ...], tuple[int, ...]]


class Phases:
    """Which phase each step of one request is in, and where that phase's stretch began."""

    __slots__ = ("_scanner",)

    def __init__(self, reasoning: Reasoning | None, prompt: Sequence[int] = ()) -> None:
        self._scanner = None if reasoning is None else SpanScanner(reasoning[0], reasoning[1], prompt)

    @property
    def scanner(self) -> SpanScanner | None:
        """The request's span automaton (``None``: no reasoning delimiters in force)."""
        return self._scanner

    def at(self, generated: Sequence[int]) -> tuple[str, int]:
        """``(phase, began)`` of the step after ``generated``: ``"reasoning"`` or ``"answer"``, and the
        generated position where its stretch began (``0`` at most: a span the prompt opened)."""
        if self._scanner is None:
            return "answer", 0
        open_, began = self._scanner.segment(generated)
        return ("reasoning" if open_ else "answer"), max(began, 0)


class _Since(Sequence[int]):
    """``history[begin:]`` without a copy (a scoped entry's own history)."""

    __slots__ = ("_history", "_begin")

    def __init__(self, history: Sequence[int], begin: int) -> None:
        self._history, self._begin = history, begin

    def __len__(self) -> int:
        return max(0, len(self._history) - self._begin)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self._history[self._begin + start : self._begin + stop : step]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._history[self._begin + index]

    def __iter__(self) -> Iterator[int]:
        for i in range(self._begin, len(self._history)):
            yield self._history[i]


def _own(history: Sequence[int], began: int) -> Sequence[int]:
    return history if began == 0 else _Since(history, began)


class _Scoped:
    __slots__ = ("inner", "scope", "phases")

    def __init__(self, inner: Any, scope: str, phases: Phases) -> None:
        self.inner, self.scope, self.phases = inner, scope, phases

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        phase, began = self.phases.at(input_ids)
        if phase == self.scope:
            self.inner(_own(input_ids, began), logits)

    def __repr__(self) -> str:
        return f"{type(self.inner).__name__}[scope={self.scope}]"


class _ScopedPlanned(_Scoped):
    """A scoped processor whose step is a ``RowOp`` (the host path batches it)."""

    __slots__ = ()

    def row_op(self, input_ids: Sequence[int]) -> Any:
        phase, began = self.phases.at(input_ids)
        return self.inner.row_op(_own(input_ids, began)) if phase == self.scope else None


class ScopeTables(SpanTables):
    """A scoped entry's device span state (``DeviceThinking``): the request's reasoning delimiters,
    followed from the prompt on, and per slot whether the entry acts inside a span (``reasoning``)."""

    def delimiters(self, template: ScopedTemplate) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return template.start, template.end

    def initial(self, template: ScopedTemplate) -> int:
        return CLOSED if template.initial is None else template.initial

    def outs(self, template: ScopedTemplate) -> tuple[int, int]:
        """The state's ``OUT``: whether the entry acts, outside a span and inside one."""
        return (0, 1) if template.scope == "reasoning" else (1, 0)

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Where the row is in its entry's phase (and may be decided at all): a membership (bool)."""
        return torch.logical_and(self.state[slots, OUT] if state is None else state[:, OUT], valid)

    def host_state(self, template: ScopedTemplate, processor: Any, history: Sequence[int], committed: int) -> list[int]:
        """A resumed request's state (its one host scan): outside a span, ``ANCHOR`` is where the
        answer's stretch began (the last end, ``0`` without one), as a transition leaves it."""
        state = super().host_state(template, processor, history, committed)
        if state[SEL] == 0:
            state[ANCHOR] = processor.phases.at(history)[1]
        return state


def _from_output(state: list[int]) -> list[int]:
    """A scope state whose stretch starts at the output at the earliest (``ANCHOR``, counted from the
    prompt's end until ``DeviceThinking`` lifts it: at least 0), as the hosted path's ``_own``: a
    span the prompt opened starts at the output's first token (its ``KEY`` left as it is)."""
    state[ANCHOR] = max(state[ANCHOR], 0)
    return state


class StretchScopeTables(ScopeTables):
    """``ScopeTables`` of a positional inner kind: each row's decision is how many tokens its phase's
    stretch holds (``-1``: not in the entry's phase, or not decidable), which ``ScopedGroup`` gives
    the inner step as its generated counts. Decided in the fused advance (``STRETCH``). A span the
    prompt opened is kept as starting at the output (``ANCHOR`` at least the prompt's length, as the
    hosted path's ``_own``), so a count never exceeds the output's."""

    rule = STRETCH

    def initial_state(self, template: ScopedTemplate) -> list[int]:
        return _from_output(super().initial_state(template))

    def resumed_state(self, template: ScopedTemplate, span: int | None, committed: int) -> list[int]:
        return _from_output(super().resumed_state(template, span, committed))

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``generated - ANCHOR`` (positions from the prompt's start: the tokens since the last
        transition, or since the output's start) in the entry's phase, else ``-1``."""
        rows = self.state[slots] if state is None else state
        return torch.where(torch.logical_and(rows[:, OUT], valid), generated() - rows[:, ANCHOR], self.no_token)


class FloorScopeTables(ScopeTables):
    """``ScopeTables`` of a scoped entry of a window-decided kind (``ScopedDecided`` without host
    histories): each row's decision is its floor, the first position (from the prompt's start) of
    its stretch of the entry's phase (``ANCHOR``, at least the prompt's length: a span the prompt
    opened starts at the output, as the hosted path's ``_own``; the inner kind's own history start,
    the prompt's length, bounds it too), or ``NEVER``, past every position, for a row out of that
    phase, no member or not decidable (a placeholder draft before it): a row's floor is below
    ``NEVER`` only where the inner kind acts. Decided in the fused advance (``FLOOR``); else two ops
    and the state's ``index`` (none with drafts)."""

    rule = FLOOR

    def initial_state(self, template: ScopedTemplate) -> list[int]:
        return _from_output(super().initial_state(template))

    def resumed_state(self, template: ScopedTemplate, span: int | None, committed: int) -> list[int]:
        return _from_output(super().resumed_state(template, span, committed))

    def __init__(self, num_slots: int, device: torch.device) -> None:
        super().__init__(num_slots, device)
        self._never = torch.full((), NEVER, dtype=torch.long, device=self.device)  # kept: no scalar per step
        self.no_decision = self._never

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        rows = self.state[slots] if state is None else state
        return torch.where(torch.logical_and(rows[:, OUT], valid), rows[:, ANCHOR], self._never)


class ScopedGroup(SpanDecided):
    """A scoped entry of one inner kind (``inner_type``, a plain group) at one entry position: each
    row is decided first (``1``: in the entry's phase), then the inner group's gathered step runs
    with the other rows left out of its membership. One subclass per inner kind
    (``scoped_group``), so two kinds scoped at one position keep apart."""

    inner_type: ClassVar[type[Group]]

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.inner = self.inner_type(level, num_slots, device)

    def assign(self, slot: int, template: Any) -> None:
        super().assign(slot, template)
        self.inner.assign(slot, None if template is None else template.inner)

    def _write(self, slot: int, template: Any) -> None:
        pass  # the inner group's tables hold the entry (``assign``)

    def flush(self) -> bool:
        changed = super().flush()
        return self.inner.flush() or changed

    @property
    def _sentinel(self) -> int:
        """The tables' last slot, never assigned (``SlotBatch.sentinel``): a row there is no member."""
        return self.member.num_slots - 1

    def host_decisions(self, n: int) -> np.ndarray:
        return np.full(n, -1, dtype=np.int64)

    def host_decision(self, processor: Any, history: Sequence[int]) -> int:
        """The tokens the row's phase's stretch holds (``-1``: not in the entry's phase)."""
        return int(processor.stretch(history))

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: np.ndarray,
                             upload: StepUpload) -> Dead | None:
        """Listed layout, decided on the host: the rows in scope, as a gathered layout (every row's
        slot, the sentinel for the others; then, for a positional inner kind, each row's stretch
        count) in one upload; nothing runs when no row is in scope."""
        inside = decisions >= 0
        if not inside.any():
            return None
        n = step.logits.shape[0]
        positional = self.inner.positional
        buf = upload.buffer(2 * n if positional else n)
        buf[:n] = self._sentinel
        member_rows = rows.rows[inside]
        buf[member_rows] = rows.slots[inside]
        if positional:
            buf[n:] = 0
            buf[n + member_rows] = decisions[inside]
        values = upload.upload(2 * n if positional else n)
        slot_of_row = values[:n]
        gathered = GatheredRows(slot_of_row, self.inner.member.dev[slot_of_row, 0])
        settle = self.inner.counted_settle(step, rows.last) if positional else None
        if settle is not None:  # host counts: never negative
            counts = values[n:]
            return settle(step, gathered, counts, counts,
                          lambda: self.inner.apply_gathered(_at_counts(step, counts), gathered))
        return self.inner.apply_gathered(_at_counts(step, values[n:]) if positional else step, gathered)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["last"] = rows.last  # no later group masks the layout's rows (``counted_settle``)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """``decisions``: the rows in phase (``ScopeTables.decide_state``'s membership), or for a
        positional inner kind each row's stretch count (``StretchScopeTables``), or ``-1`` for every
        row (the decider holds no tables for the group)."""
        if decisions.dtype == torch.bool:
            return self.inner.apply_gathered(step, GatheredRows(rows.slot_of_row, decisions))
        if self.inner.positional:
            assert step.generated is not None  # positional: the runner's positions were asked for
            last = rows.last if step.flag_rows is None else bool(self._cache.get("last"))
            settle = self.inner.counted_settle(step, last)
            if settle is not None:  # the stretch counts (``StretchScopeTables``: never above the output's)
                return settle(step, rows, decisions, decisions, lambda: self._at_decisions(step, rows, decisions))
        return self._at_decisions(step, rows, decisions)

    def _at_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """The inner kind's gathered step for the rows ``decisions`` put in phase (``>= 0``), a
        positional kind's at those counts (never above the output's)."""
        member = rows.member & (decisions >= 0)
        if not self.inner.positional:
            return self.inner.apply_gathered(step, GatheredRows(rows.slot_of_row, member))
        assert step.generated is not None
        return self.inner.apply_gathered(_at_counts(step, torch.minimum(decisions, step.generated)),
                                         GatheredRows(rows.slot_of_row, member))


#: Covered tokens of a live history read again into its stretch's copy each step (``_Stretch``):
#: an engine rewrites only its newest slots (a placeholder's, under async scheduling: vLLM's V1
#: runner), so a rewrite deeper than this in a list it grows goes unseen.
TAIL_REREAD = 64


class _Stretch:
    """One row's stretch (its live history from ``began`` on) kept as one list across steps, so the
    inner kind sees the same list one token longer at a steady step, as it sees an engine's live
    list: each step the last ``TAIL_REREAD`` covered tokens are read again and the new ones
    appended, O(new + ``TAIL_REREAD``); copied afresh from another list or another start."""

    __slots__ = ("source", "began", "tokens")

    def __init__(self) -> None:
        self.source: list[int] | None = None
        self.began = -1
        self.tokens: list[int] = []

    def of(self, history: list[int], began: int) -> list[int]:
        """``history[began:]``, as this row's one list."""
        if history is not self.source or began != self.began:
            self.source, self.began = history, began
            self.tokens = history[began:]
            return self.tokens
        tokens = self.tokens
        n, total = len(tokens), len(history) - began
        if total < n:
            del tokens[total:]
            n = total
        k = min(n, TAIL_REREAD)
        tokens[n - k : n] = history[began + n - k : began + n]
        if total > n:
            tokens.extend(history[began + n :])
        return tokens


class ScopedDecided(ScopedGroup, SpanWindowDecided):
    """A scoped entry of a decided inner kind that opts in (``DecidedGroup.scopable``), where the
    adapter passes host histories (vLLM's V1 runner): the inner group decides every member row (the
    layout's whole deciders list, so what it keeps per layout stays aligned), a row in the entry's
    phase from its stretch's history (the hosted path's ``_own``; from a live list, one list kept
    across steps: ``_Stretch``), any other from the inner kind's ``neutral_history``, which decides
    nothing; the inner group applies the decisions. Without host histories, with a token window:
    each row's floor from ``DeviceThinking`` (``FloorScopeTables``), the inner group's step over the
    window from it on (``apply_window_decisions``); else its request is hosted (``runs_without_histories``)."""

    inner: DecidedGroup
    #: ``DeviceThinking``'s decision for a row where its tables hold none of the group's slots: a
    #: floor past every position (``FloorScopeTables``), so a row's floor is below ``NEVER`` only
    #: where the inner kind acts
    no_decision: ClassVar[int] = NEVER

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        self._held: dict[int, Template] = {}  # slot -> its inner template (written again: ``_from_window``)
        super().__init__(level, num_slots, device)
        self.inner.scoped = True  # rows out of phase decided from ``neutral_history`` itself
        if isinstance(self.inner, WindowDecided) and not self.inner.tables_at_first_window:
            self.inner.from_window = True  # its tables written for ``apply_floored`` (a few values a slot)

    def assign(self, slot: int, template: Any) -> None:
        super().assign(slot, template)
        if template is None:
            self._held.pop(slot, None)
        else:
            self._held[slot] = template.inner

    def _window_tables(self) -> bool:
        """Where the inner kind writes its window tables once it is known to decide from the window
        (``WindowDecided.tables_at_first_window``): from now on, every current member's written
        (flushed with the group); whether they were written just now."""
        inner = self.inner
        if not isinstance(inner, WindowDecided) or inner.from_window:
            return False
        inner.from_window = True
        for slot, template in self._held.items():
            inner.assign(slot, template)
        return True

    def _from_window(self) -> WindowDecided:
        """The inner group, deciding from the window, its tables written (``_window_tables``; written
        at this step: flushed now, non-blocking copies as at a batch change)."""
        if self._window_tables():
            self.inner.flush()
        assert isinstance(self.inner, WindowDecided)
        return self.inner

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        """Where the adapter passes a token window and the inner kind decides from it from a floor on
        (``WindowDecided.floored``) for this template (``fits_window``): floors by ``DeviceThinking``
        (``FloorScopeTables``). Asked only where the adapter passes no host histories, so ``group``'s
        inner tables are written from here on (``_window_tables``), its members counted by
        ``fits_window``."""
        inner = cls.inner_type
        assert isinstance(template, ScopedTemplate)
        if isinstance(group, ScopedDecided):
            group._window_tables()
        return (token_window and issubclass(inner, WindowDecided) and inner.floored
                and inner.fits_window(template.inner, getattr(group, "inner", None)))

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self.inner.prepare(rows, stride)

    def host_decisions(self, n: int) -> Any:
        return self.inner.host_decisions(n)

    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> Any:
        """The inner group's decisions of every member row, each from its own history (see the class
        doc); a row whose phase cannot be found fails alone and is decided neutral."""
        held = self._cache.get("deciders")
        if held is None or held[0] is not deciders:  # once per layout (``ListedRows.deciders``)
            held = self._cache["deciders"] = (deciders, [(row, slot, p.inner) for row, slot, p in deciders],
                                              [_Stretch() for _ in deciders])
        own = list(histories)
        neutral = self.inner.neutral_history
        for (row, slot, processor), stretch in zip(deciders, held[2]):
            history = histories[row]
            try:
                began = processor.began(history)
            except Exception as exc:  # a bug must not escape the sampler: fail this request alone
                fail(row, slot, exc)
                began = None
            if began is None:
                own[row] = neutral
            elif began and type(history) is list:
                own[row] = stretch.of(history, began)
            else:
                own[row] = _own(history, began)
        return self.inner.decide_rows(held[1], own, fail)

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: Any,
                             upload: StepUpload) -> Dead | None:
        return self.inner.apply_host_decisions(step, rows, decisions, upload)

    def apply_window_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor,
                               window: TokenWindow) -> Dead | None:
        """``decisions``: each row's floor (``FloorScopeTables``), from which on the inner kind decides
        its rows from ``window`` and applies them (``WindowDecided.apply_floored``). (``DeviceThinking``
        decides ``-1`` everywhere only where its tables hold none of the group's slots: then every
        row's slot is no member of the inner group, which decides nothing for it.)"""
        return self._from_window().apply_floored(step, rows, window, decisions)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """Without the step's window: nothing (never resident there: ``runs_without_histories``)."""
        return None


class ScopedClock(ScopedDecided, ClockDecided):
    """A scoped entry of a clock-decided kind (``deadline``, ``DecidedGroup.scopable``): resident on
    every runner with slots. With host histories as ``ScopedDecided`` (a row in phase decided by its
    clock, one out of phase from ``neutral_history``: nothing). Without, the clock is read on the
    host per member slot (``host_decision``: the inner kind's, no history) and nothing runs on the
    device unless one is due; then the adapter forces only the rows ``DeviceThinking`` finds in the
    entry's phase (``ScopeTables``: a membership), ``apply_device_decisions`` given the tokens per
    row (``-1`` elsewhere)."""

    no_decision: ClassVar[int] = -1

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        return True

    def host_decision(self, processor: Any, history: Sequence[int]) -> Any:
        """One member slot's clock (the inner kind's decision, no history), its phase left to the device."""
        return self.inner.host_decision(processor.inner, history)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """``decisions``: each row's token (``-1``: none), already ``-1`` outside the entry's phase."""
        return self.inner.apply_device_decisions(step, rows, decisions)


class ScopedSpanTables(StretchSpans, ScopeTables):
    """``ScopeTables`` of a scoped entry of a span-following kind (``trigger``, ``thinking_budget``):
    the inner kind's own tables restarted at each stretch (``stretch_spans.StretchSpans``; one
    subclass per inner tables class, ``_span_tables``) in ``SpanTables.restart_state``, the hosted inner
    processor's state at the start of what it is fed."""


class ScopedSpan(ScopedDecided):
    """A scoped entry of a span-following decided kind that opts in (``trigger``, ``thinking_budget``):
    with host histories as ``ScopedDecided`` (a row in phase decided from its stretch, one out of
    phase from ``neutral_history``: nothing); without, where the restart is exact
    (``runs_without_histories``), ``DeviceThinking`` decides each row by the inner kind's automaton
    restarted at each stretch (``ScopedSpanTables``): its token (``-1``: none, and out of the
    entry's phase), forced by the inner group."""

    no_decision: ClassVar[int] = -1

    @classmethod
    def runs_without_histories(cls, template: Template, group: Group | None, *, token_window: bool) -> bool:
        """Where the inner automaton's restart is the hosted path's (the inner template's
        tables' ``SpanTables.restarts_exactly``: not always for ``thinking_budget``)."""
        assert isinstance(template, ScopedTemplate) and template.device_spans is not None
        tables = cast("type[ScopedSpanTables]", template.device_spans)
        return tables.inner_tables.restarts_exactly(template.inner)

    def apply_window_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor,
                               window: TokenWindow) -> Dead | None:
        """The window is not read: as ``apply_device_decisions``."""
        return self.apply_device_decisions(step, rows, decisions)

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead | None:
        """``decisions``: each row's token (``-1``: none), forced by the inner group (with the layout's
        every row it was given, so its fused settle applies where it would unscoped)."""
        if self._cache.get("every") is rows:
            self.inner._cache["every"] = rows
        return self.inner.apply_device_decisions(step, rows, decisions)


def _at_counts(step: StepInputs, counts: torch.Tensor) -> StepInputs:
    """``step`` with ``counts`` as each row's generated count (a scoped positional kind counts from
    its stretch's start) and no runner positions (``pos``), which would count from the output's."""
    return replace(step, generated=counts, pos=None, pos_offset=None)


_GROUPS: dict[type[Group], type[ScopedGroup]] = {}
_TEMPLATES: dict[type[Group], type[ScopedTemplate]] = {}


def _resident_inner(template: Template) -> bool:
    """Whether a scoped entry of ``template`` can be resident: its kind's step reads no tokens
    (positions it may read: ``ScopedGroup`` gives it the stretch's counts; values the host plans in
    the listed layout it never gets, as it runs gathered), or its decided kind decides any history
    and has a neutral one (``DecidedGroup.scopable``: ``no_repeat_ngram`` and ``dry`` without
    ``include_prompt``, ``banned_phrases``, ``multiple_choice``: ``ScopedDecided``; without host
    histories where the kind is ``WindowDecided.floored`` and the template fits its window tables;
    ``deadline``: ``ScopedClock``; ``trigger``, ``thinking_budget``: ``ScopedSpan``)."""
    group = template.group
    return not issubclass(group, DecidedGroup) or group.scopable(template)


def scoped_group(inner: type[Group]) -> type[ScopedGroup]:
    """The ``ScopedGroup`` subclass of ``inner`` (``ScopedDecided`` for a decided kind; made once)."""
    made = _GROUPS.get(inner)
    if made is None:
        base = (ScopedClock if issubclass(inner, ClockDecided)
                else ScopedSpan if issubclass(inner, SpanDecided) and not issubclass(inner, WindowDecided)
                else ScopedDecided if issubclass(inner, DecidedGroup) else ScopedGroup)
        made = _GROUPS[inner] = type(f"Scoped{inner.__name__}", (base,), {
            "inner_type": inner, "restrictive": inner.restrictive, "writes_neg_inf": inner.writes_neg_inf,
            "positional": inner.positional, "__module__": __name__})
        globals().setdefault(made.__name__, made)  # found by name, as a pickle looks classes up
    return made


@dataclass(frozen=True)
class ScopedTemplate(Template):
    """An entry that acts only in one phase: ``inner``'s template at the steps of ``scope``
    (``"reasoning"`` or ``"answer"``), phases given by the delimiters ``start``/``end`` followed
    from the prompt on (``initial``: where the span the prompt left open began, or ``None``)."""

    inner: Template
    scope: str
    start: tuple[int, ...]
    end: tuple[int, ...]
    initial: int | None
    #: how many of the prompt's last tokens a start sequence may cover (``SpanScanner.prompt_tail``)
    prompt_tail: int = 0
    reads_tokens: ClassVar[bool] = True
    device_spans: ClassVar[type | None] = ScopeTables


_SPAN_TABLES: dict[type[SpanTables], type[ScopedSpanTables]] = {}


def _span_tables(inner: type[SpanTables]) -> type[ScopedSpanTables]:
    """The ``ScopedSpanTables`` subclass restarting ``inner`` tables (made once)."""
    made = _SPAN_TABLES.get(inner)
    if made is None:
        made = _SPAN_TABLES[inner] = type(f"Scoped{inner.__name__}", (ScopedSpanTables,), {
            "inner_tables": inner, "__module__": __name__})
        globals().setdefault(made.__name__, made)
    return made


def _tables_of(inner: Template) -> type[ScopeTables]:
    """The ``ScopeTables`` a scoped entry of ``inner`` decides its rows by without host histories."""
    group = inner.group
    if issubclass(group, SpanDecided) and not issubclass(group, WindowDecided):
        assert inner.device_spans is not None, "a span-decided kind names its tables"
        return _span_tables(cast("type[SpanTables]", inner.device_spans))
    if issubclass(group, WindowDecided):
        return FloorScopeTables
    return StretchScopeTables if group.positional and not issubclass(group, ClockDecided) else ScopeTables


def scoped_template(inner: Template, scope: str, scanner: SpanScanner) -> ScopedTemplate:
    """``inner`` scoped to ``scope``, as a template of its own class (``scoped_group``'s)."""
    kind = _TEMPLATES.get(inner.group)
    if kind is None:
        kind = _TEMPLATES[inner.group] = type(f"Scoped{type(inner).__name__}", (ScopedTemplate,), {
            "group": scoped_group(inner.group), "__module__": __name__,
            "device_spans": _tables_of(inner)})
        globals().setdefault(kind.__name__, kind)
    return kind(inner, scope, scanner.start, scanner.end, scanner.initial, scanner.prompt_tail)


class _ScopedResident(_ScopedPlanned):
    """A scoped processor with a template (see the module doc)."""

    __slots__ = ("template",)

    def __init__(self, inner: Any, scope: str, phases: Phases, scanner: SpanScanner) -> None:
        super().__init__(inner, scope, phases)
        self.template = scoped_template(inner.template, scope, scanner)

    def in_scope(self, input_ids: Sequence[int]) -> bool:
        """Whether the step after ``input_ids`` is in this entry's phase."""
        return self.phases.at(input_ids)[0] == self.scope

    def stretch(self, input_ids: Sequence[int]) -> int:
        """How many tokens of ``input_ids`` the entry's phase's current stretch holds (its history's
        length, as the hosted step sees it), or ``-1`` outside the entry's phase."""
        phase, began = self.phases.at(input_ids)
        return len(input_ids) - began if phase == self.scope else -1

    def began(self, input_ids: Sequence[int]) -> int | None:
        """Where the stretch of the entry's phase after ``input_ids`` began (the hosted step gives the
        inner processor ``_own(input_ids, began)``), or ``None`` outside the entry's phase."""
        phase, began = self.phases.at(input_ids)
        return began if phase == self.scope else None

    def span(self, input_ids: Sequence[int]) -> int | None:
        """The open span after ``input_ids`` (``DeviceThinking``'s host scan of a resumed request)."""
        scanner = self.phases.scanner
        assert scanner is not None
        return scanner.span(input_ids)


class _ScopedResidentCalled(_ScopedResident):
    """A ``_ScopedResident`` of a processor without a ``row_op`` (``dry``: its lowering is no
    ``RowOp``): where hosted, the plan calls it (``_Scoped.__call__``)."""

    __slots__ = ()
    row_op = None  # type: ignore[assignment]  # no ``RowOp``: ``RequestLogitsProcessor.plan`` calls it


def scoped(processor: Any, scope: str, phases: Phases) -> Any:
    """``processor`` applied only at ``scope``'s steps (``"always"``: ``processor`` itself)."""
    if scope == "always":
        return processor
    template = getattr(processor, "template", None)
    scanner = phases.scanner
    if template is not None and scanner is not None and _resident_inner(template):
        if hasattr(processor, "row_op"):
            return _ScopedResident(processor, scope, phases, scanner)
        if issubclass(template.group, DecidedGroup):  # ``dry``: decided by its group, called where hosted
            return _ScopedResidentCalled(processor, scope, phases, scanner)
    return _ScopedPlanned(processor, scope, phases) if hasattr(processor, "row_op") else _Scoped(processor, scope, phases)
