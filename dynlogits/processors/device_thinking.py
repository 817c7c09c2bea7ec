"""Span-following decisions on the device, shared by the kinds decided from a span they follow
(``thinking_budget``, ``trigger``): ``DeviceThinking`` and the per-slot ``SpanTables`` a kind's
template names (``Template.device_spans``), for engines whose histories live on the device (Model
Runner V2).

``DeviceThinking`` keeps per slot and entry where the open span began (``CLOSED``: none; ``<= 0``: in
the prompt, from the template's initial span) and how many tokens were scanned; each step advances
it over the newly committed tokens only (read from the engine's ``tokens`` ``[slots, max_len]``,
``prompt_len``, ``total_len``, passed to every ``step``), then each row over its drafts. Constant
cost per step, no read back, except one host scan of a request resumed with more than
``MAX_DEVICE_CATCH_UP`` generated tokens. The span rule is ``dynlogits.processors.spans``' (the host
automaton, ``SpanScanner``); a kind's ``SpanTables`` subclass adds its delimiters and the rule that
decides from the span (``SpanTables.decide``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .slots import GatheredRows, Group, SlotTable
from .spans import PLACEHOLDER

__all__ = ["CLOSED", "DeviceThinking", "Matcher", "SpanTables"]

#: ``DeviceThinking``'s span start for "no open span" (a span the prompt opened starts at ``<= 0``).
CLOSED = -(1 << 40)


# -- what a kind keeps per slot ---------------------------------------------------------------------
class Matcher(NamedTuple):
    """Delimiter sequences per slot, right-aligned for ``_ends_with``: ``want[s, j]`` is the token
    the window's column ``j`` must hold, ``unused[s, j]`` a column before the sequence, ``length[s]``
    its length."""

    want: torch.Tensor
    unused: torch.Tensor
    length: torch.Tensor

    def rows(self, slots: torch.Tensor | None) -> Matcher:
        """The matcher of ``slots`` (``None``: every slot, in order)."""
        return self if slots is None else Matcher(self.want[slots], self.unused[slots], self.length[slots])


class SpanTables:
    """Per-slot delimiters and span state of one entry position of a kind whose decision follows a
    span (``DeviceThinking``); a subclass writes its template (``set``) and decides per row
    (``decide``). ``in_prompt``: whether delimiters are matched from the prompt on (else only in the
    generated tokens); ``closes``: whether the end sequence closes a span (else a span, once open,
    stays open and the end is never matched)."""

    in_prompt = True
    closes = True

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.start = SlotTable(num_slots, torch.long, device)
        self.start_len = SlotTable(num_slots, torch.long, device)
        self.end = SlotTable(num_slots, torch.long, device)
        self.end_len = SlotTable(num_slots, torch.long, device)
        self.member = SlotTable(num_slots, torch.bool, device, pad=0)
        self.members: set[int] = set()  # host view of ``member``: the tables go when it is empty
        self.span = torch.full((num_slots,), CLOSED, dtype=torch.long, device=device)
        self.scanned = torch.zeros(num_slots, dtype=torch.long, device=device)
        self._tables = [self.start, self.start_len, self.end, self.end_len, self.member]
        self._matchers: dict[bool, Matcher] = {}  # end? -> matcher, until the next set or flush
        self._offsets: dict[int, torch.Tensor] = {}  # width -> ``-width .. -1``, kept

    def table(self) -> SlotTable:
        """A further per-slot table of the subclass's, flushed with the others."""
        made = SlotTable(self.member.num_slots, torch.long, self.member.device)
        self._tables.append(made)
        return made

    def set(self, slot: int, template: Any | None) -> None:
        """Write ``template``'s delimiters at ``slot`` (``None``: the slot leaves)."""
        self._matchers.clear()  # on CPU the tables are the mirror: a write changes them now
        if template is None:
            if slot in self.members:
                self.members.discard(slot)
                self.member.set(slot, [0])
            return
        self.members.add(slot)
        self.member.set(slot, [1])
        start, end = self.delimiters(template)
        self.start.set(slot, start)
        self.start_len.set(slot, [len(start)])
        self.end.set(slot, end)
        self.end_len.set(slot, [len(end)])

    def delimiters(self, template: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The sequences that open and close ``template``'s span."""
        raise NotImplementedError

    def initial(self, template: Any) -> int:
        """Where the span the prompt left open began (``CLOSED``: none)."""
        return CLOSED

    def host_span(self, processor: Any, history: Sequence[int]) -> int | None:
        """The host processor's span after ``history`` (a resumed request's one host scan)."""
        return processor.span(history)

    def decide(self, slots: torch.Tensor, span: torch.Tensor, generated: torch.Tensor, valid: torch.Tensor,
               row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The token each row is forced to (``-1``: none), given its span start (``CLOSED``: none),
        its generated count (drafts before it included), whether it may be decided at all, and
        ``row_tokens(slots, positions)``: its tokens at generated ``positions``."""
        raise NotImplementedError

    def flush(self) -> None:
        changed = False
        for table in self._tables:
            changed = table.flush() or changed
        if changed:
            self._matchers.clear()  # recomputed after the copies just queued

    def matcher(self, end: bool) -> Matcher:
        """The start (or end) sequences as a ``Matcher``, computed on the device once per batch
        change (a handful of ops every span advance would otherwise repeat)."""
        made = self._matchers.get(end)
        if made is None:
            seq, length = (self.end.dev, self.end_len.dev[:, 0]) if end else (self.start.dev, self.start_len.dev[:, 0])
            j = torch.arange(seq.shape[1], device=seq.device)
            offset = seq.shape[1] - length  # the sequence's token k sits at column offset + k
            want = seq.gather(1, (j[None, :] - offset[:, None]).clamp(min=0))
            made = self._matchers[end] = Matcher(want, j[None, :] < offset[:, None], length)
        return made

    def offsets(self, width: int) -> torch.Tensor:
        """``[-width, .., -1]``: the positions of the ``width`` tokens before a position, relative to it."""
        made = self._offsets.get(width)
        if made is None:
            made = self._offsets[width] = torch.arange(-width, 0, device=self.span.device)
        return made


# -- one step's token source ---------------------------------------------------------------------
@dataclass
class _Step:
    """This step's token source: ``token(slots, positions)`` reads generated token ``positions`` of
    ``slots`` (``None``: every slot of the tables, in order; committed ones only); ``committed[s]``
    how many slot ``s`` has. ``every``: each table slot's row of ``tokens`` (the sentinel past the
    engine's slots reads the last one, masked by its callers)."""

    tokens: torch.Tensor
    prompt_len: torch.Tensor
    committed: torch.Tensor
    every: torch.Tensor

    def token(self, slots: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor:
        if slots is None:
            rows, prompt = self.every, self.prompt_len
        else:
            rows, prompt = slots.clamp(max=self.tokens.shape[0] - 1), self.prompt_len[slots]
        column = (prompt[:, None] + positions).clamp_(0, self.tokens.shape[1] - 1)
        return self.tokens[rows[:, None], column].long()


def _ends_with(window: torch.Tensor, seq: Matcher, reach: torch.Tensor) -> torch.Tensor:
    """Whether the tokens ending at the window's end are ``seq``'s: ``window[i, j]`` is the token
    ``width - j`` before it (``width`` = ``seq.want``'s, right-aligned); ``reach[i]``: how many
    tokens (prompt included) end there."""
    return (reach >= seq.length) & ((window == seq.want) | seq.unused).all(1)


class DeviceThinking:
    """Decisions on the device for a ``SlotBatch``'s span-following groups: ``thinking_budget``'s and
    every kind whose template names ``SpanTables`` (``device_spans``, e.g. ``trigger``)."""

    def __init__(self, num_slots: int, device: torch.device | str, *, max_new: int = 1) -> None:
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.max_new = max_new  # committed tokens a slot can gain per step (1 + speculative tokens)
        #: (entry position, group type) -> tables, as ``SlotBatch.groups``: two kinds at one position keep apart
        self.tables: dict[tuple[int, type[Group]], SpanTables] = {}
        self._cold: dict[int, Any] = {}  # slots to scan on the host before their first step
        self._step: _Step | None = None
        self._inputs: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        self._catch_up = 0  # tokens of resumed requests to follow at the next step, on the device
        self._every: dict[int, torch.Tensor] = {}  # engine slot count -> _Step.every

    #: A resumed request with at most this many generated tokens is followed on the device (a round
    #: of ops per token at its first step); a longer one is scanned once on the host (one read back).
    MAX_DEVICE_CATCH_UP = 16

    def assign(self, slot: int, request: Any, *, resumed: int = 0) -> None:
        """``slot``'s occupant (a ``dynlogits.sdk.GuardedRequest``; ``None`` clears); ``resumed``: it enters with that many generated
        tokens (preempted and resumed), followed at its first step on the device, or on the host
        past ``MAX_DEVICE_CATCH_UP``."""
        self._cold.pop(slot, None)
        templates: dict[tuple[int, type[Group]], Any] = {}
        if request is not None and request.processor is not None:
            for i, p in enumerate(request.processor.processors):
                template = getattr(p, "template", None)
                if template is not None and getattr(template, "device_spans", None) is not None:
                    templates[(i, template.group)] = template
        for key in set(self.tables) | set(templates):
            template = templates.get(key)
            tables = self.tables.get(key)
            if tables is None:  # a key new to the tables is one of ``templates``
                assert template is not None
                tables = self.tables[key] = template.device_spans(self.num_slots, self.device)
            tables.set(slot, template)
            initial = CLOSED if template is None else tables.initial(template)
            tables.span[slot : slot + 1].fill_(initial)  # not ``span[slot] = x``: a blocking copy on CUDA
            tables.scanned[slot : slot + 1].fill_(0)
            if not tables.members:  # no request left at this key: steps skip it
                del self.tables[key]
        if templates and resumed > self.MAX_DEVICE_CATCH_UP:
            self._cold[slot] = request
        elif templates and resumed:
            self._catch_up = max(self._catch_up, resumed)

    def flush(self) -> None:
        for tables in self.tables.values():
            tables.flush()

    def step(self, tokens: torch.Tensor, prompt_len: torch.Tensor, total_len: torch.Tensor, *,
             input_ids: torch.Tensor | None = None, local_pos: torch.Tensor | None = None,
             rows_per_request: int = 1) -> None:
        """Advance every entry's span state over the committed tokens new since the last step, and
        remember this step's rows: ``input_ids[r]`` is the token fed at row ``r`` and
        ``local_pos[r]`` how many drafts precede it (both ``None`` without speculative decoding).
        ``rows_per_request`` bounds a request's rows this step (1 + its drafts): a request commits
        at most that many tokens by the next step, so ``max_new`` grows to it."""
        self.max_new = max(self.max_new, rows_per_request)
        if not self.tables:
            return
        pad = self.num_slots - len(prompt_len)  # table rows past the engine's slots (a sentinel) read as empty
        prompt = torch.nn.functional.pad(prompt_len.long(), (0, pad))
        committed = torch.nn.functional.pad((total_len.long() - prompt_len.long()).clamp_(min=0), (0, pad))
        every = self._every.get(tokens.shape[0])
        if every is None:  # each table slot's row of the engine's matrix, kept while it has as many rows
            every = self._every[tokens.shape[0]] = torch.arange(self.num_slots, device=self.device).clamp_(
                max=tokens.shape[0] - 1)
        source = _Step(tokens, prompt, committed, every)
        self._step = source
        self._inputs = (input_ids, local_pos)
        if self._cold:
            self._scan_cold(source)
        rounds = 2 * self.max_new + self._catch_up  # twice the most a step adds (a lag always shrinks),
        self._catch_up = 0  # plus a resumed request's whole history, once
        for tables in self.tables.values():
            for _ in range(rounds):
                position = tables.scanned
                fresh = tables.member.dev[:, 0] & (position < source.committed)
                span = self._advance(tables, None, tables.span, position + 1, fresh, source.prompt_len,
                                     lambda pos: source.token(None, pos))
                tables.span.copy_(span)
                tables.scanned.add_(fresh.long())

    @staticmethod
    def _advance(tables: SpanTables, slots: torch.Tensor | None, span: torch.Tensor, upto: torch.Tensor,
                 fresh: torch.Tensor, prompt_len: torch.Tensor, token_at) -> torch.Tensor:  # noqa: ANN001
        """The span after the token ending at ``upto`` (only where ``fresh``) of each of ``slots``
        (``None``: every slot of the tables, in order: no gather); where the tables match from the
        prompt on (``in_prompt``), a delimiter may begin in the prompt (``prompt_len`` tokens before
        generated position 0)."""
        start = tables.matcher(False).rows(slots)
        end = tables.matcher(True).rows(slots) if tables.closes else None  # a span that never closes reads no end
        width = max(start.want.shape[1], 0 if end is None else end.want.shape[1])
        window = token_at(upto[:, None] + tables.offsets(width)[None, :])
        reach = upto + prompt_len if tables.in_prompt else upto
        closed = span == CLOSED
        opens = fresh & closed & _ends_with(window[:, width - start.want.shape[1] :], start, reach)
        if end is None:
            return torch.where(opens, upto, span)
        closes = (fresh & ~closed & (upto - span >= end.length)
                  & _ends_with(window[:, width - end.want.shape[1] :], end, reach))
        return torch.where(opens, upto, torch.where(closes, torch.full_like(span, CLOSED), span))

    def _scan_cold(self, source: _Step) -> None:
        """Resumed requests: follow their generated tokens once, on the host (a read back)."""
        for slot, request in list(self._cold.items()):
            committed = int(source.committed[slot])
            history = source.tokens[slot, int(source.prompt_len[slot]) : int(source.prompt_len[slot]) + committed].tolist()
            for (level, _), tables in self.tables.items():
                if not bool(tables.member.dev[slot, 0]):
                    continue
                processor = request.processor.processors[level]
                span = tables.host_span(processor, history)  # the host automaton, same rule
                tables.span[slot : slot + 1].fill_(CLOSED if span is None else span)
                tables.scanned[slot : slot + 1].fill_(committed)
        self._cold.clear()

    def _row_tokens(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token at history ``positions[r, :]`` for each row: committed ones from the engine's
        matrix, the rest from the drafts fed before the row (``input_ids``)."""
        source = self._step
        assert source is not None
        committed = source.committed[slots][:, None]
        from_matrix = source.token(slots, positions)
        input_ids, local_pos = self._inputs
        if input_ids is None or local_pos is None:
            return from_matrix
        rows = torch.arange(len(slots), device=slots.device)
        first = (rows - local_pos.long())[:, None]  # the row fed the last committed token
        draft_row = (first + positions - committed + 1).clamp_(0, len(input_ids) - 1)
        return torch.where(positions < committed, from_matrix, input_ids.long()[draft_row])

    def decide(self, group: Group, rows: GatheredRows) -> torch.Tensor:
        """The token each row must be forced to now (``-1``: none): its slot's span state, advanced
        over the drafts before the row, then its tables' rule (``SpanTables.decide``)."""
        tables = self.tables.get((group.level, type(group)))
        source = self._step
        if tables is None or source is None:
            return torch.full_like(rows.slot_of_row, -1)
        slots = rows.slot_of_row.long()
        member = rows.member & tables.member.dev[slots, 0]
        committed = source.committed[slots]
        input_ids, local_pos = self._inputs
        drafts = torch.zeros_like(committed) if local_pos is None else local_pos.long()
        span = tables.span[slots].clone()
        valid = member.clone()
        for j in range(1, self.max_new):  # the drafts before each row, one position at a time
            fresh = member & (j <= drafts)
            if input_ids is not None:
                first = torch.arange(len(slots), device=slots.device) - drafts
                valid &= ~(fresh & (input_ids.long()[(first + j).clamp(0, len(input_ids) - 1)] == PLACEHOLDER))
            span = self._advance(tables, slots, span, committed + j, fresh, source.prompt_len[slots],
                                 lambda pos: self._row_tokens(slots, pos))
        return tables.decide(slots, span, committed + drafts, valid, self._row_tokens)
