"""A span-following kind's automaton restarted at each stretch of a scope (a scoped ``trigger`` under
Model Runner V2): ``StretchSpans``, mixed into the scope's ``SpanTables`` by ``scope.ScopedSpanTables``.

The scope's tables (the request's reasoning delimiters) give each slot its stretch's start
(``ANCHOR``); the inner kind's own ``SpanTables`` (``inner``, e.g. ``TriggerTables``) follow its
delimiters as they do unscoped, except that before every advance a slot whose stretch began
elsewhere than the inner state's start (``epoch``) is restarted: looking for its start sequence,
the first match allowed to begin at the stretch's first position, never before the output
(``max(ANCHOR, prompt_len)``). That is the hosted path's automaton fed the stretch alone
(``scope._own``): a sequence straddling the stretch's start never matches, and a stretch that ends
and begins again starts afresh. A row is decided by the inner kind's rule where the scope finds it
in the entry's phase, ``-1`` elsewhere. Positions count from the prompt's start, as in
``device_thinking``; a restart is replay-safe (positions at or before its threshold never match).

Per steady step, beyond the scope's fused advance: one inner fused advance (``spans_advance_`` with
its restart stage, its rule's decision in the entry's phase included; a row reads it off with
``index``, ``where``); with drafts, one ``spans_drafts_`` for the scope's rows and one for the inner
rows, each restarted at the anchor its scope row reaches over the drafts before it and advanced
over them. Where the fused ops are not used (the CPU, a failed probe) the same in eager ops: the
restart's 5 (``maximum``, ``addcmul``, ``ne``, ``where``, ``copy_``), and per draft position the
advance's, then the inner kind's ``decide_state``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from dynlogits.kernels.spans import NO_RULE

from .device_thinking import ANCHOR, BIG, KEY, NEVER, OUT, STATE, DeviceThinking, SpanTables, StepSource, gated_spans
from .slots import GatheredRows

__all__ = ["StretchSpans"]

#: A state row of a slot that holds no request.
_EMPTY = [NEVER, 0, 0, 0]


class StretchSpans(SpanTables):
    """The inner kind's tables (``inner_tables``, made with the scope's) restarted at each stretch
    of the scope whose state ``self.state`` holds (see the module doc). A state row given to
    ``put_state`` is the scope's ``STATE`` values, then optionally the inner's and the epoch."""

    inner_tables: ClassVar[type[SpanTables]]
    inner: SpanTables

    def __init__(self, num_slots: int, device: torch.device) -> None:
        super().__init__(num_slots, device)
        self.inner = self.inner_tables(num_slots, device)
        #: per slot the stretch start (positions from the prompt's start) the inner state began at
        self.epoch = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self._inner_fused = False  # the inner automaton's last advance was fused: ``inner.decided`` holds
        #: per slot the inner state a restart at position 0 writes (``KEY`` past the start sequence)
        self.restart = self.table()

    # -- slots --------------------------------------------------------------------------------------
    def set(self, slot: int, template: Any | None) -> None:
        super().set(slot, template)
        inner = None if template is None else template.inner
        self.inner.set(slot, inner)
        if inner is not None:
            self.restart.set(slot, self.inner.restart_state(inner))

    def initial_state(self, template: Any) -> list[int]:
        """The scope's state after the prompt, the inner's, and the epoch (the output's start)."""
        return [*super().initial_state(template), *self.inner.initial_state(template.inner), 0]

    def host_state(self, template: Any, processor: Any, history: Sequence[int], committed: int) -> list[int]:
        """A resumed request's states: the scope's, the inner automaton's over the current stretch
        (``processor.began``: ``None`` out of the entry's phase, where it restarts at the next
        stretch anyway), and the epoch (the stretch's start, never before the output). In a stretch
        after the output's start (one a restart began), the inner state is what the restart makes
        it: where the inner processor's span over the stretch is the one it starts with (``<= 0``),
        ``restart_state`` at the stretch's start; outside a span, its start sequence looked for
        within the stretch only."""
        state = super().host_state(template, processor, history, committed)
        began = processor.began(history)
        inner = self.inner
        span = None if began is None else inner.host_span(processor.inner, history[began:])
        values = inner.resumed_state(template.inner, None if span is None else span + began, committed)
        if began:  # a restart's stretch
            if span is not None and span <= 0:
                values = [v + began * k for v, k in zip(inner.restart_state(template.inner), inner.scale)]
            elif span is None:
                start = inner.delimiters(template.inner)[0]
                values[KEY] = BIG * len(start) + max(committed + 1, began + len(start))
        return [*state, *values, max(state[ANCHOR], 0)]

    def put_state(self, slot: int, values: Sequence[int]) -> None:
        super().put_state(slot, values[:STATE])
        self.inner.put_state(slot, values[STATE : 2 * STATE] if len(values) > STATE else _EMPTY)
        self.epoch[slot].fill_(values[2 * STATE] if len(values) > 2 * STATE else 0)

    def flush(self) -> None:
        super().flush()
        self.inner.flush()

    def lift(self, n: int, lift: torch.Tensor) -> None:
        super().lift(n, lift)
        self.inner.lift(n, lift)
        self.epoch[:n].add_(lift[:, 0])

    # -- a step -------------------------------------------------------------------------------------
    def _restarted(self, state: torch.Tensor, restart: torch.Tensor, epoch: torch.Tensor, start: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """The inner ``state`` rows restarted (``restart``: their slots' rows of ``self.restart``)
        where their stretch's start ``start`` is not their ``epoch``: looking for the start sequence,
        whose first match may end at ``start + len``, i.e. begin at ``start`` (into ``out`` if given)."""
        fresh = torch.addcmul(restart, start[:, None], self.inner.scale_dev)
        if out is None:
            return torch.where((epoch != start)[:, None], fresh, state)
        return torch.where((epoch != start)[:, None], fresh, state, out=out)

    def follow(self, thinking: DeviceThinking, tokens: torch.Tensor, total_len: torch.Tensor, rounds: int,
               fused: bool) -> None:
        """After the scope's advance over ``rounds`` positions: restart the inner automaton where its
        stretch changed, then advance it over the same positions (by the fused op where the scope's
        was: ``follow_advance``'s, run before this; its rule's decisions in ``inner.decided``)."""
        inner = self.inner
        n = tokens.shape[0]
        assert self.prompt_len is not None
        state = inner.state[:n]
        self._inner_fused = fused
        if fused:  # the restart, the advance and the decision (in the entry's phase): follow_advance's op
            return
        start = torch.maximum(self.state[:n, ANCHOR], self.prompt_len)  # never before the output
        self._restarted(state, self.restart.dev[:n], self.epoch[:n], start, out=state)
        self.epoch[:n].copy_(start)
        consts = inner.consts_of(n)
        for back in range(rounds - 1, -1, -1):
            inner.advance(state, consts, thinking.window(tokens, total_len, inner.width, back),
                          total_len - back if back else total_len)

    def follow_advance(self, thinking: DeviceThinking, tokens: torch.Tensor, total_len: torch.Tensor,
                       rounds: int) -> tuple[Any, ...] | None:
        """The inner automaton's fused op after the scope's advance: its restart where its stretch
        changed, its advance over the same ``rounds`` positions and its rule's decision (in the
        entry's phase), as ``spans_advance_``'s arguments."""
        inner = self.inner
        n = tokens.shape[0]
        assert self.prompt_len is not None
        return (inner.state[:n], inner.consts.dev[:n], tokens, total_len, inner.scale_dev, inner.width, rounds,
                inner.decided[:n], *thinking.forced(inner, n), inner.rule, self.restart.dev[:n], self.epoch[:n],
                self.state[:n], self.prompt_len)

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Without drafts (``state`` ``None``): the inner rule's decision of the slot (the fused
        advance's, else ``decide_state``'s) where the row is in the entry's phase, else ``-1``."""
        assert state is None, "with drafts: decide_drafted"
        inner = self.inner
        if self._inner_fused and inner.rule != NO_RULE:  # the fused advance decided in the entry's phase only
            return torch.where(valid, inner.decided[slots], self.no_token)
        decided = inner.decide_state(slots, None, generated, valid, row_tokens)
        return torch.where(torch.logical_and(self.state[slots, OUT], valid), decided, self.no_token)

    def decide_drafted(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                       local_pos: torch.Tensor) -> torch.Tensor:
        """With drafts: each row's scope state over the drafts before it, then its inner state
        restarted at the anchor that state reaches, advanced over the same drafts and decided by the
        inner kind's rule where the row is in the entry's phase, ``-1`` elsewhere: after a fused
        step two ``spans_drafts_`` (the inner one with its restart stage; eager if a variant fails),
        else eager ops."""
        if thinking.fused_step:  # on CUDA named by its launches' variant (gated_spans)
            drafts = self._drafted_args(thinking, rows, source, local_pos) if self.device.type == "cuda" else None
            return gated_spans(self.device, (), drafts or (),
                               lambda: self._fused_drafted(thinking, rows, source, local_pos, drafts),
                               lambda: self._eager_drafted(thinking, rows, source, local_pos))
        return self._eager_drafted(thinking, rows, source, local_pos)

    def _drafted_args(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                      local_pos: torch.Tensor) -> list[tuple[Any, ...]]:
        """``_fused_drafted``'s ``spans_drafts_`` arguments: the scope's, then (where the inner kind
        has a rule) the inner one's, restarted at the scope's states and decided where they are valid
        (both ops' outputs made here: ``DeviceThinking.fused_states_args``)."""
        scope = thinking.fused_states_args(self, rows, source, local_pos)
        inner = self.inner
        if inner.rule == NO_RULE:  # the inner kind decides from its states, eagerly
            return [scope]
        restart = (self.restart.dev, self.epoch, scope[11], source.prompt_len)
        return [scope, thinking.fused_states_args(inner, rows, source, local_pos, scope[12], restart)]

    def _fused_drafted(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                       local_pos: torch.Tensor, drafts: list[tuple[Any, ...]] | None = None) -> torch.Tensor:
        drafts = self._drafted_args(thinking, rows, source, local_pos) if drafts is None else drafts
        scope, valid, _ = thinking.fused_states(self, rows, source, local_pos, args=drafts[0])
        if len(drafts) == 1:  # the inner kind decides from its states, eagerly
            return self._inner_drafted(thinking, rows, source, local_pos, scope, valid)
        return thinking.fused_states(self.inner, rows, source, local_pos, args=drafts[1])[2]

    def _eager_drafted(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                       local_pos: torch.Tensor) -> torch.Tensor:
        slots = rows.slot_of_row
        scope, valid = thinking.over_drafts(self, rows, source, local_pos, self.state[slots], rows.member)
        return self._inner_drafted(thinking, rows, source, local_pos, scope, valid)

    def _inner_drafted(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                       local_pos: torch.Tensor, scope: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The inner rows restarted at ``scope``'s stretches, advanced over the drafts and decided by
        eager ops."""
        slots = rows.slot_of_row
        clamped = source.clamped(slots)
        committed = source.total_len[clamped]
        inner = self.inner
        start = torch.maximum(scope[:, ANCHOR], source.prompt_len[clamped])
        state = thinking.over_drafts(inner, rows, source, local_pos,
                                     self._restarted(inner.state[slots], self.restart.dev[slots], self.epoch[slots],
                                                     start), valid)[0]
        decided = inner.decide_state(slots, state, lambda: committed + local_pos.long(), valid, thinking.row_tokens)
        return torch.where(torch.logical_and(scope[:, OUT], valid), decided, self.no_token)
