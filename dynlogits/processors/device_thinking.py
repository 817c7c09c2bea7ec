"""Span-following decisions on the device, shared by the kinds decided from a span they follow
(``thinking_budget``, ``trigger``, scoped entries): ``DeviceThinking`` and the per-slot ``SpanTables``
a kind's template names (``Template.device_spans``), for engines whose histories live on the device
(Model Runner V2).

Each slot of a ``SpanTables`` keeps one row of state (``STATE`` longs): what the span automaton of
``dynlogits.processors.spans`` looks for next (``SEL``: 0 the start sequence, outside any span; 1
the end sequence, inside one), where its last transition happened (``ANCHOR``: the open span's
start), a value the kind reads per state (``OUT``,
e.g. a scoped entry's "in my phase") and ``KEY = BIG * length + threshold``: the looked-for sequence's
length and the first position at which it may end (after a start: ``start + len(end)``, so an end
never overlaps its start; after an end: the next position). A position at or before the threshold
is never a transition, so replaying positions already followed changes nothing: a step follows
the last ``1 + drafts`` committed positions of every slot whatever it followed before (no count of
scanned tokens), and a position ``p`` of a slot is a transition iff
``BIG * matches(p) + p >= KEY`` (``matches``: how many tokens of the looked-for sequence end at
``p``; columns outside it never match). The transition writes the next state from per-slot
constants (``SpanTables.consts``: per state the sequence right-aligned and the next state's base),
with one ``gather``, one ``addcmul`` and one ``where``. Positions count from the prompt's start (the engine's
``total_len`` is the last committed one): a slot's state is written at ``assign`` from the prompt's
end (the host knows no prompt length there) and its first step adds its prompt length (one
``addcmul_`` a table, at steps after a batch change only); ``SpanTables.span`` gives generated
positions again.

A step is one fused op a table (``dynlogits.kernels.spans.spans_advance_``: every round, a
speculative config's and a resumed request's catch-up included, with its window read, in one Triton
launch on CUDA once its probe passed, equal to the eager ops bit for bit), which also writes each
slot's decision where the table's kind has a rule (``SpanTables.rule``: ``trigger``'s phrase,
``thinking_budget``'s due end token, a scoped positional entry's stretch count, a scoped
window-decided entry's floor; ``SpanTables.decided``), so a row without drafts before it reads its
decision off it (``index``, ``where``) instead of its kind's ``decide_state`` ops; rows
with drafts before them are followed and decided per row in ``decide`` by one more fused op a
table (``spans_drafts_``; without a rule, ``decide_state`` then decides from the rows' states).
Elsewhere (the CPU, a failed probe) it is, for all tables together, one window read (``add``,
``index``) a round, then per table ``gather``, ``eq``, ``sum``, ``add``, ``ge``, ``addcmul``,
``where`` (in place), the same per draft position in ``decide``, and ``decide_state`` decides. No
read back, except one host scan of a request resumed with more than ``MAX_DEVICE_CATCH_UP``
generated tokens. The forcing kinds' groups (``SettledForcing``) then force and settle their rows
in one fused op where no later group masks them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from dynlogits.kernels import spans as spans_kernels
from dynlogits.kernels import thinking_force
from dynlogits.kernels.spans import DUE, FLOOR, FORCING, GATE, NO_RULE, PHRASE, STRETCH, spans_advance_, spans_drafts_

from .modes import HostForcingGroup
from .slots import Dead, GatheredRows, Group, ListedRows, SlotTable, StepInputs
from .spans import PLACEHOLDER
from .window import cached_arange

__all__ = ["ANCHOR", "BIG", "CLOSED", "DUE", "FLOOR", "KEY", "NEVER", "NO_RULE", "OUT", "PHRASE", "SEL", "STATE", "STRETCH",
           "DeviceThinking",
           "SettledForcing", "SpanTables", "StepSource", "gated_spans"]

T = TypeVar("T")

#: The span start a decision reads for "no open span" (a span the prompt opened starts at ``<= 0``).
CLOSED = -(1 << 40)
#: ``KEY``'s weight of a sequence's length: above any difference of two positions.
BIG = 1 << 32
#: A key no position reaches (a span that never closes).
NEVER = 1 << 62
#: A right-aligned sequence's column before its first token: no token id equals it.
_PAD = -(1 << 40)
#: State columns (see the module doc).
KEY, ANCHOR, SEL, OUT = 0, 1, 2, 3
STATE = 4


class SpanTables:
    """Per-slot delimiters and span state of one entry position of a kind whose decision follows a
    span (``DeviceThinking``); a subclass writes its template (``set``) and decides per row
    (``decide``, or ``decide_state``). ``in_prompt``: whether delimiters are matched from the prompt
    on (else only in the generated tokens); ``closes``: whether the end sequence closes a span (else
    a span, once open, stays open and the end is never matched)."""

    in_prompt = True
    closes = True
    #: per state column, whether a transition adds its position (``KEY`` and ``ANCHOR`` always; ``OUT``
    #: where the kind's output counts from the transition, e.g. ``thinking_budget``'s due count)
    scale: tuple[int, ...] = (1, 1, 0, 0)
    #: the decision the fused advance makes per slot at a step without drafts
    #: (``dynlogits.kernels.spans``: ``PHRASE``, ``DUE``, from the sequence table ``forced()`` names;
    #: ``STRETCH``, ``FLOOR``, from the state alone; ``NO_RULE``: ``decide_state`` decides); it must
    #: equal ``decide_state``'s
    rule: int = NO_RULE

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.scale_dev = torch.zeros(STATE, dtype=torch.long, device=self.device)
        for column, value in enumerate(self.scale):  # fills: no host copy
            self.scale_dev[column].fill_(value)
        self.no_token = torch.full((), -1, dtype=torch.long, device=self.device)  # a decision's "none", kept
        self.no_decision = self.no_token  # what ``decide`` gives a non-member row (``FLOOR``: ``NEVER``)
        self._closed = torch.full((), CLOSED, dtype=torch.long, device=self.device)
        self.start = SlotTable(num_slots, torch.long, device)
        self.start_len = SlotTable(num_slots, torch.long, device)
        self.end = SlotTable(num_slots, torch.long, device)
        self.end_len = SlotTable(num_slots, torch.long, device)
        self.members: set[int] = set()  # the tables go when it is empty
        #: per slot the automaton's state (``STATE`` columns); a slot without a request never moves
        self.state = torch.zeros((num_slots, STATE), dtype=torch.long, device=self.device)
        self.state[:, KEY] = NEVER
        self.width = 1  # the longest delimiter of the members: the window a step reads
        self.prompt_len: torch.Tensor | None = None  # the last step's (``span``)
        self._rows: dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, int]]] = {}  # slot -> start, end, outs
        self.templates: dict[int, Any] = {}  # slot -> its template
        self.consts = self._consts_table()
        self._tables = [self.start, self.start_len, self.end, self.end_len, self.consts]
        self._offsets: dict[int, torch.Tensor] = {}  # width -> ``-width .. -1``, kept
        #: per slot the decision the fused advance made (``rule``), valid after a fused step
        self.decided = torch.full((num_slots,), -1, dtype=torch.long, device=self.device)

    # -- what a subclass says ---------------------------------------------------------------------
    def table(self) -> SlotTable:
        """A further per-slot table of the subclass's, flushed with the others."""
        made = SlotTable(self.num_slots, torch.long, self.device)
        self._tables.append(made)
        return made

    def delimiters(self, template: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The sequences that open and close ``template``'s span."""
        raise NotImplementedError

    def forced(self) -> tuple[SlotTable, SlotTable] | None:
        """The per-slot sequence ``rule`` forces from and its length (``None``: no rule)."""
        return None

    def initial(self, template: Any) -> int:
        """Where the span the prompt left open began (``CLOSED``: none)."""
        return CLOSED

    def outs(self, template: Any) -> tuple[int, int]:
        """The state's ``OUT`` outside a span and inside one (by default whether one is open),
        plus the transition's position where ``scale`` says so."""
        return 0, 1

    def prompt_tail(self, template: Any) -> int:
        """How many of the prompt's last tokens a start sequence may cover (a delimiter straddling
        the prompt's end): the template's ``prompt_tail`` (``SpanScanner.prompt_tail``) where the
        tables match from the prompt on, else none."""
        return int(getattr(template, "prompt_tail", 0)) if self.in_prompt else 0

    def host_span(self, processor: Any, history: Sequence[int]) -> int | None:
        """The host processor's span after ``history`` (a resumed request's one host scan)."""
        return processor.span(history)

    def host_state(self, template: Any, processor: Any, history: Sequence[int], committed: int) -> list[int]:
        """A resumed request's state after ``committed`` generated tokens (``history``), from the
        host processor's scan (``host_span``)."""
        return self.resumed_state(template, self.host_span(processor, history), committed)

    def decide(self, slots: torch.Tensor, span: torch.Tensor, generated: torch.Tensor, valid: torch.Tensor,
               row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The token each row is forced to (``-1``: none), given its span start (``CLOSED``: none),
        its token count (drafts before it included), whether it may be decided at all, and
        ``row_tokens(slots, positions)``: its tokens at ``positions``. Positions and counts are from
        the prompt's start (only differences of them are generated counts)."""
        raise NotImplementedError

    def decide_state(self, slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                     valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Each row's decision from its state (``state``: per row; ``None``: its slot's, no draft
        before it); by default ``decide`` with the span start it holds."""
        rows = self.state[slots] if state is None else state
        span = torch.where(rows[:, SEL] == 1, rows[:, ANCHOR], self._closed)
        return self.decide(slots, span, generated(), valid, row_tokens)

    # -- slots --------------------------------------------------------------------------------------
    @property
    def span(self) -> torch.Tensor:
        """Every slot's open span start in generated positions (``CLOSED``: none), computed from the
        state after a step (the last step's prompt lengths)."""
        prompt = torch.zeros(self.num_slots, dtype=torch.long, device=self.device)
        if self.prompt_len is not None:
            prompt[: len(self.prompt_len)] = self.prompt_len
        return torch.where(self.state[:, SEL] == 1, self.state[:, ANCHOR] - prompt, CLOSED)

    def set(self, slot: int, template: Any | None) -> None:
        """Write ``template``'s delimiters at ``slot`` (``None``: the slot leaves)."""
        if template is None:
            self.members.discard(slot)
            self._rows.pop(slot, None)
            self.templates.pop(slot, None)
            return
        self.members.add(slot)
        self.templates[slot] = template
        start, end = self.delimiters(template)
        self.start.set(slot, start)
        self.start_len.set(slot, [len(start)])
        self.end.set(slot, end)
        self.end_len.set(slot, [len(end)])
        self._rows[slot] = (tuple(start), tuple(end), self.outs(template))
        width = max(len(start), len(end) if self.closes else 1)
        if width > self.width:  # a wider window: every row's right-aligned sequences move
            self.width = width
            self._tables.remove(self.consts)
            self.consts = self._consts_table()
            self._tables.append(self.consts)
            for other in self._rows:
                self._write_consts(other)
        else:
            self._write_consts(slot)

    def _consts_table(self) -> SlotTable:
        return SlotTable(self.num_slots, torch.long, self.device, width=2 * (self.width + STATE), pad=0)

    def _write_consts(self, slot: int) -> None:
        """Per state (outside, inside a span) the sequence it looks for, right-aligned in
        ``width`` columns, and the base of the state a match leads to (``KEY`` and ``ANCHOR`` add
        the position; ``SEL`` and ``OUT`` as they are)."""
        start, end, (out_closed, out_open) = self._rows[slot]
        w = self.width
        def aligned(seq: tuple[int, ...]) -> list[int]:
            return [_PAD] * (w - len(seq)) + list(seq)
        opened = [BIG * len(end) + len(end) if self.closes else NEVER, 0, 1, out_open]
        closed = [BIG * len(start) + 1, 0, 0, out_closed]
        self.consts.set(slot, aligned(start) + opened + (aligned(end) if self.closes else [_PAD] * w) + closed)

    def initial_state(self, template: Any) -> list[int]:
        """``template``'s state after its prompt (no token generated yet)."""
        start, end = self.delimiters(template)
        out_closed, out_open = self.outs(template)
        span = self.initial(template)
        if span != CLOSED:
            return [BIG * len(end) + span + len(end) if self.closes else NEVER, span, 1, out_open + span * self.scale[OUT]]
        first = max(1, len(start) - self.prompt_tail(template))  # a start reaches no further back than the prompt's tail
        return [BIG * len(start) + first, 0, 0, out_closed]

    def resumed_state(self, template: Any, span: int | None, committed: int) -> list[int]:
        """The state after ``committed`` generated tokens whose open span (host scan) is ``span``."""
        start, end = self.delimiters(template)
        out_closed, out_open = self.outs(template)
        if span is not None:
            return [BIG * len(end) + span + len(end) if self.closes else NEVER, span, 1, out_open + span * self.scale[OUT]]
        first = max(1, len(start) - self.prompt_tail(template))
        return [BIG * len(start) + max(committed + 1, first), 0, 0, out_closed]

    def restart_state(self, template: Any) -> list[int]:
        """The state a scoped entry's automaton restarts in at each stretch of its phase, as position
        0 (``stretch_spans.StretchSpans`` adds the stretch's start by ``scale``): the hosted inner
        processor's state at the start of what it is fed. By default no span open and the start
        sequence looked for from position 0 on."""
        return self.resumed_state(template, None, 0)

    @classmethod
    def restarts_exactly(cls, template: Any) -> bool:
        """Whether a scoped entry of ``template`` restarted at each stretch (``restart_state``) is the
        hosted path's, so that it may run without host histories; by default yes."""
        return True

    def lift(self, n: int, lift: torch.Tensor) -> None:
        """Add ``lift`` (``[n, 1]``: a new occupant's prompt length, else 0) to the first ``n``
        slots' positions: their state, counted from the prompt's end, from its start."""
        self.state[:n].addcmul_(lift, self.scale_dev)

    def follow(self, thinking: DeviceThinking, tokens: torch.Tensor, total_len: torch.Tensor, rounds: int,
               fused: bool) -> None:
        """After every table's advance over ``rounds`` positions (``fused``: by the fused op), a further
        automaton's own (``stretch_spans.StretchSpans``; fused: ``follow_advance``'s op, run before);
        nothing by default."""

    def follow_advance(self, thinking: DeviceThinking, tokens: torch.Tensor, total_len: torch.Tensor,
                       rounds: int) -> tuple[Any, ...] | None:
        """The ``spans_advance_`` arguments of a further automaton's fused advance after every
        table's (``stretch_spans.StretchSpans``); none by default."""
        return None

    def decide_drafted(self, thinking: DeviceThinking, rows: GatheredRows, source: StepSource,
                       local_pos: torch.Tensor) -> torch.Tensor:
        """``DeviceThinking.decide`` with drafts (``local_pos``: each row's drafts before it): each
        row's slot state advanced over the drafts before it, then decided; by one ``spans_drafts_``
        after a fused step (eager if its variant fails), else eager ops. Tables following a further
        automaton override it (``stretch_spans.StretchSpans``)."""
        if thinking.fused_step:  # on CUDA named by its launch's variant (gated_spans)
            drafts = thinking.fused_states_args(self, rows, source, local_pos) if self.device.type == "cuda" else None
            return gated_spans(self.device, (), () if drafts is None else (drafts,),
                               lambda: thinking.fused_drafts(self, rows, source, local_pos, drafts),
                               lambda: thinking.eager_drafts(self, rows, source, local_pos))
        return thinking.eager_drafts(self, rows, source, local_pos)

    def put_state(self, slot: int, values: Sequence[int]) -> None:
        """Write ``slot``'s state row (fills, no host copy)."""
        for column, value in enumerate(values):
            self.state[slot, column].fill_(value)

    def flush(self) -> None:
        for table in self._tables:
            table.flush()

    def offsets(self, width: int) -> torch.Tensor:
        """``[-width, .., -1]``: the positions of the ``width`` tokens before a position, relative to it."""
        made = self._offsets.get(width)
        if made is None:
            made = self._offsets[width] = torch.arange(-width, 0, device=self.device)
        return made

    def consts_of(self, n: int) -> torch.Tensor:
        """``consts`` of the first ``n`` slots as ``[n, 2, width + STATE]`` (a view)."""
        return self.consts.dev[:n, : 2 * (self.width + STATE)].view(n, 2, self.width + STATE)

    def advance(self, state: torch.Tensor, consts: torch.Tensor, window: torch.Tensor, position: torch.Tensor,
                fresh: torch.Tensor | None = None) -> None:
        """Follow one position per row in place: ``state`` ``[r, STATE]`` (a view of ``self.state`` or
        rows gathered from it), ``consts`` ``[r, 2, width + STATE]`` its rows' constants,
        ``window[:, -width:]`` the tokens ending at ``position`` (generated count, prompt excluded);
        ``fresh``: which rows have that position at all (``None``: every row)."""
        w = self.width
        now = consts.gather(1, state[:, SEL, None, None].expand(-1, 1, w + STATE))[:, 0]
        matches = (window[:, window.shape[1] - w :] == now[:, :w]).sum(1)
        hit = torch.add(position, matches, alpha=BIG) >= state[:, KEY]
        if fresh is not None:
            hit &= fresh
        torch.where(hit[:, None], torch.addcmul(now[:, w:], position[:, None], self.scale_dev), state, out=state)


class SettledForcing(HostForcingGroup):
    """A ``HostForcingGroup`` decided on the device (with ``modes.SpanDecided``: ``trigger``,
    ``thinking_budget``): where no later group can mask its rows and the step takes flags per row,
    the forcing and the settle of the rows it leaves with no token are one fused op
    (``dynlogits.kernels.thinking_force.decided_settle_``, what ``force_device_decisions`` and
    ``Failures.record_dead`` write), once its probe passed; else
    ``HostForcingGroup.apply_device_decisions``. No later group: ``ListedRows.last``, noted at
    ``prepare`` for the layout whose rows ``every_row`` gathers, or, under speculative decoding
    (the gathered layout, ``StepInputs.flag_real_rows``: only real rows flagged), ``GatheredRows.last``."""

    def prepare(self, rows: ListedRows, stride: int) -> None:
        super().prepare(rows, stride)
        self._cache["last"] = rows.last

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> Dead:
        flag_rows = step.flag_rows
        if flag_rows is not None:
            ready = bool(self._cache.get("last")) and self._cache.get("every") is rows
        else:
            flag_rows = step.flag_real_rows
            ready = flag_rows is not None and rows.last
        if flag_rows is None or not ready:
            return super().apply_device_decisions(step, rows, decisions)

        def eager() -> Dead:
            return super(SettledForcing, self).apply_device_decisions(step, rows, decisions)

        if not thinking_force.GATE.ready(self.device):  # the CPU: the eager ops, nothing built
            return eager()
        args = self._settle_args(step, rows, decisions)
        return thinking_force.run_gated(self.device, args, lambda: self._settle(rows, step.generated, args, flag_rows), eager)

    def _settle_args(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> tuple[Any, ...]:
        """``thinking_force.decided_settle_``'s arguments for the step (its ``flags`` and ``dead``
        made here: two ``torch.empty``, no launch)."""
        n = len(decisions)
        positions = step.generated
        none = self._cache.get("none")
        if none is None:
            none = self._cache["none"] = (torch.empty(0, dtype=torch.long, device=self.device),
                                          torch.empty(0, dtype=torch.bool, device=self.device),
                                          torch.empty((0, 1), dtype=torch.long, device=self.device))
        if positions is None:
            positions = none[0]
        real = none[1] if step.flag_rows is not None or step.real_rows is None else step.real_rows
        flags = torch.empty((2, n), dtype=torch.long, device=self.device)
        dead = torch.empty(n, dtype=torch.bool, device=self.device)
        return (step.logits, decisions, rows.member, rows.slot_of_row, step.stops, positions, self.member.num_slots - 1,
                flags, dead, real, none[2], none[2], False)

    @staticmethod
    def _settle(rows: GatheredRows, generated: torch.Tensor | None, args: tuple[Any, ...],
                flag_rows: Callable[[torch.Tensor, Any], None]) -> Dead:
        """The fused forcing and settle (``args``: ``_settle_args``); the dead rows reported through
        ``flag_rows`` (with drafts the dead real rows alone: ``StepInputs.real_rows``)."""
        thinking_force.decided_settle_(*args)
        flags, dead = args[7], args[8]
        flag_rows(flags, None)
        return Dead(None, rows.slot_of_row, None, generated, settled=dead, flagged=True)


def gated_spans(device: torch.device, advances: Sequence[tuple[Any, ...]], drafts: Sequence[tuple[Any, ...]],
                 fused: Callable[[], T], eager: Callable[[], T]) -> T:
    """``fused()`` (the span ops with ``advances``' and ``drafts``' arguments) through ``GATE``: on
    CUDA named by their launches' variant (``kernels.spans.variant``), so a variant not compiled yet
    compiles off the step and ``eager()`` answers until it lands."""
    return GATE.run_named(device, fused, eager, spans_kernels.variant, advances, drafts)


# -- one step's token source ---------------------------------------------------------------------
@dataclass
class StepSource:
    """This step's token source: ``tokens`` ``[slots, max_len]``, ``prompt_len`` and ``total_len``
    (prompt and committed tokens) of the engine's slots; a table slot past them (the sentinel) reads
    the last."""

    tokens: torch.Tensor
    prompt_len: torch.Tensor
    total_len: torch.Tensor

    def clamped(self, slots: torch.Tensor) -> torch.Tensor:
        return slots.clamp(max=self.tokens.shape[0] - 1)

    def token(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Tokens at ``positions`` (``[rows, k]``, from the prompt's start) of ``slots`` (committed ones only)."""
        rows = self.clamped(slots)
        return self.tokens[rows[:, None], positions.clamp(0, self.tokens.shape[1] - 1)].long()




class DeviceThinking:
    """Decisions on the device for a ``SlotBatch``'s span-following groups: ``thinking_budget``'s,
    scoped entries' and every kind whose template names ``SpanTables`` (``device_spans``, e.g.
    ``trigger``)."""

    def __init__(self, num_slots: int, device: torch.device | str, *, max_new: int = 1) -> None:
        self.num_slots = num_slots
        self.device = torch.device(device)
        self.max_new = max_new  # committed tokens a slot can gain per step (1 + speculative tokens)
        #: (entry position, group type) -> tables, as ``SlotBatch.groups``: two kinds at one position keep apart
        self.tables: dict[tuple[int, type[Group]], SpanTables] = {}
        self._cold: dict[int, Any] = {}  # slots to scan on the host before their first step
        self._step: StepSource | None = None
        self._inputs: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        self._catch_up = 0  # tokens of resumed requests to follow at the next step, on the device
        self._rows: dict[int, torch.Tensor] = {}  # engine slot count -> ``arange[:, None]``
        self._aranges: dict[int, torch.Tensor] = {}  # n -> ``arange(n)``
        #: slots assigned since the last step: their state counts from the prompt's end until the
        #: step adds their prompt length (``_fresh``: 1 at those slots, on the device)
        self._pending: set[int] = set()
        self._fresh = SlotTable(num_slots, torch.long, self.device, pad=0)
        self._columns: dict[tuple[int, int], torch.Tensor] = {}  # (width, back) -> window column offsets
        self._decided = False  # the last step was fused: ``SpanTables.decided`` holds its rules' decisions
        self._no_fed: torch.Tensor | None = None  # an empty ``input_ids``, kept

    #: A resumed request with at most this many generated tokens is followed on the device (a round
    #: per token at its first step: of the fused kernel's loop, or of eager ops); a longer one is
    #: scanned once on the host (one read back).
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
            tables.put_state(slot, [NEVER, 0, 0, 0] if template is None else tables.initial_state(template))
            if not tables.members:  # no request left at this key: steps skip it
                del self.tables[key]
        if templates:
            self._pending.add(slot)
            self._fresh.set(slot, [1])
        if templates and resumed > self.MAX_DEVICE_CATCH_UP:
            self._cold[slot] = request
        elif templates and resumed:
            self._catch_up = max(self._catch_up, resumed)

    def flush(self) -> None:
        self._fresh.flush()
        for tables in self.tables.values():
            tables.flush()

    def window(self, tokens: torch.Tensor, total_len: torch.Tensor, width: int, back: int) -> torch.Tensor:
        """Every engine slot's ``width`` tokens ending ``back`` positions before its last committed
        one (a column before the row's start reads an arbitrary token: never a transition)."""
        n = tokens.shape[0]
        rows = self._rows.get(n)
        if rows is None:
            rows = self._rows[n] = torch.arange(n, device=self.device)[:, None]
        columns = self._columns.get((width, back))
        if columns is None:
            columns = self._columns[(width, back)] = torch.arange(-width - back, -back, device=self.device)
        where = total_len[:, None] + columns
        if back:  # a catch-up round may reach before a short row's start: keep within the row
            where.clamp_(min=-tokens.shape[1])
        return tokens[rows, where]

    def step(self, tokens: torch.Tensor, prompt_len: torch.Tensor, total_len: torch.Tensor, *,
             input_ids: torch.Tensor | None = None, local_pos: torch.Tensor | None = None,
             rows_per_request: int = 1) -> None:
        """Follow every entry's span over the committed tokens new since the last step (the last
        ``max_new`` positions of every slot, those already followed replayed without effect), and
        remember this step's rows: ``input_ids[r]`` is the token fed at row ``r`` and
        ``local_pos[r]`` how many drafts precede it (both ``None`` without speculative decoding).
        ``rows_per_request`` bounds a request's rows this step (1 + its drafts): a request commits
        at most that many tokens by the next step, so ``max_new`` grows to it."""
        self.max_new = max(self.max_new, rows_per_request)
        if not self.tables:
            return
        n = tokens.shape[0]
        source = self._step = StepSource(tokens, prompt_len, total_len)
        self._inputs = (input_ids, local_pos)
        for tables in self.tables.values():
            tables.prompt_len = prompt_len
        if self._cold:
            self._scan_cold(source)
        if self._pending:  # new occupants: their state, counted from the prompt's end, now from its start
            lift = self._fresh.dev[:n] * prompt_len[:, None]
            for tables in self.tables.values():
                tables.lift(n, lift)
            for slot in self._pending:
                self._fresh.set(slot, [0])
            self._fresh.flush()  # after the lift, in stream order
            self._pending.clear()
        rounds = self.max_new + self._catch_up  # a resumed request's whole history, once
        self._catch_up = 0
        # one launch a table (``spans_advance_``: every round, and a rule's decision) where the
        # probe passed; else the eager rounds
        # (on CUDA named by their launches' variant: one not compiled yet compiles off the step)
        advances = self._advances(tokens, total_len, rounds) if self.device.type == "cuda" else None
        gated_spans(self.device, advances or (), (), lambda: self._fused(tokens, total_len, rounds, advances),
                     lambda: self._eager(tokens, total_len, rounds))

    @staticmethod
    def forced(tables: SpanTables, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` slots' sequence and length ``tables.rule`` forces from (without a rule, a
        stand-in the fused ops do not read)."""
        if tables.rule not in FORCING:
            return tables.decided[:n, None], tables.decided[:n, None]
        forced = tables.forced()
        assert forced is not None, "a rule forces from a table (SpanTables.forced)"
        return forced[0].dev[:n], forced[1].dev[:n]

    def _advances(self, tokens: torch.Tensor, total_len: torch.Tensor, rounds: int) -> list[tuple[Any, ...]]:
        """The fused step's ``spans_advance_`` arguments: every table's, then every further
        automaton's (``SpanTables.follow_advance``)."""
        n = tokens.shape[0]
        advances = [(tables.state[:n], tables.consts.dev[:n], tokens, total_len, tables.scale_dev, tables.width, rounds,
                     tables.decided[:n], *self.forced(tables, n), tables.rule) for tables in self.tables.values()]
        for tables in self.tables.values():
            follow = tables.follow_advance(self, tokens, total_len, rounds)
            if follow is not None:
                advances.append(follow)
        return advances

    def _fused(self, tokens: torch.Tensor, total_len: torch.Tensor, rounds: int,
               advances: list[tuple[Any, ...]] | None = None) -> None:
        """Every table's ``rounds`` positions and its rule's decisions (``SpanTables.decided``), one
        fused op a table, then a further automaton's (``advances``: ``_advances``, made here if
        ``None``)."""
        for args in self._advances(tokens, total_len, rounds) if advances is None else advances:
            spans_advance_(*args)
        for tables in self.tables.values():
            tables.follow(self, tokens, total_len, rounds, True)
        self._decided = True

    def fused_drafts(self, tables: SpanTables, rows: GatheredRows, source: StepSource, local_pos: torch.Tensor,
                     args: tuple[Any, ...] | None = None) -> torch.Tensor:
        """``decide`` with drafts after a fused step: one ``spans_drafts_`` (``fused_states``; ``args``:
        its ``fused_states_args``, made there if ``None``), then ``decide_state`` from those states
        where the table has no rule."""
        slots = rows.slot_of_row
        state, valid, decided = self.fused_states(tables, rows, source, local_pos, args=args)
        if tables.rule != NO_RULE:
            return decided
        return tables.decide_state(slots, state, lambda: source.total_len[source.clamped(slots)] + local_pos.long(),
                                   valid, self.row_tokens)

    def fused_states(self, tables: SpanTables, rows: GatheredRows, source: StepSource, local_pos: torch.Tensor,
                     member: torch.Tensor | None = None,
                     restart: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     args: tuple[Any, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One ``spans_drafts_`` with ``args`` (``fused_states_args``' for the other arguments, made
        here if ``None``): each row's state over the drafts before it, whether it may be decided and
        its rule's decision."""
        if args is None:
            args = self.fused_states_args(tables, rows, source, local_pos, member, restart)
        spans_drafts_(*args)
        return args[11], args[12], args[13]

    def fused_states_args(self, tables: SpanTables, rows: GatheredRows, source: StepSource, local_pos: torch.Tensor,
                          member: torch.Tensor | None = None,
                          restart: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                          ) -> tuple[Any, ...]:
        """``spans_drafts_``' arguments for ``fused_states``, its three outputs (each row's state,
        whether it may be decided, its decision) made here (``torch.empty``, no launch): ``member``,
        which rows may be decided at all, by default the group's members; ``restart``: the op's
        restart stage (``restart``, ``epoch``, ``scope``, ``prompt_len``: ``stretch_spans.StretchSpans``)."""
        slots = rows.slot_of_row
        r = len(slots)
        input_ids = self._inputs[0]
        if input_ids is None:
            input_ids = self._no_fed = self._no_fed if self._no_fed is not None else \
                torch.empty(0, dtype=torch.long, device=self.device)
        state = torch.empty((r, STATE), dtype=torch.long, device=self.device)
        valid = torch.empty(r, dtype=torch.bool, device=self.device)
        decided = torch.empty(r, dtype=torch.long, device=self.device)
        return (tables.state, tables.consts.dev, source.tokens, source.total_len, tables.scale_dev, tables.width, slots,
                rows.member if member is None else member, input_ids, local_pos, self.max_new - 1, state, valid, decided,
                *self.forced(tables, tables.num_slots), tables.rule, *(restart or ()))

    def _eager(self, tokens: torch.Tensor, total_len: torch.Tensor, rounds: int) -> None:
        """Every table's ``rounds`` positions: per round one window read, then ``advance`` a table."""
        self._decided = False
        n = tokens.shape[0]
        width = max(tables.width for tables in self.tables.values())
        every = [(tables, tables.state[:n], tables.consts_of(n)) for tables in self.tables.values()]
        for back in range(rounds - 1, -1, -1):
            window = self.window(tokens, total_len, width, back)
            position = total_len - back if back else total_len
            for tables, state, consts in every:
                tables.advance(state, consts, window, position)
        for tables, _, _ in every:
            tables.follow(self, tokens, total_len, rounds, False)

    def _scan_cold(self, source: StepSource) -> None:
        """Resumed requests: follow their generated tokens once, on the host (a read back)."""
        for slot, request in list(self._cold.items()):
            start = int(source.prompt_len[slot])
            committed = int(source.total_len[slot]) - start
            history = source.tokens[slot, start : start + committed].tolist()
            for (level, _), tables in self.tables.items():
                if slot not in tables.members:
                    continue
                processor = request.processor.processors[level]  # the host automaton, same rule
                tables.put_state(slot, tables.host_state(tables.templates[slot], processor, history, committed))
        self._cold.clear()

    def row_tokens(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token at ``positions[r, :]`` (from the prompt's start) for each row: committed ones from
        the engine's matrix, the rest from the drafts fed before the row (``input_ids``)."""
        source = self._step
        assert source is not None
        from_matrix = source.token(slots, positions)
        input_ids, local_pos = self._inputs
        if input_ids is None or local_pos is None:
            return from_matrix
        committed = source.total_len[source.clamped(slots)][:, None]
        rows = torch.arange(len(slots), device=slots.device)
        first = (rows - local_pos.long())[:, None]  # the row fed the last committed token
        draft_row = (first + positions - committed + 1).clamp_(0, len(input_ids) - 1)
        return torch.where(positions < committed, from_matrix, input_ids.long()[draft_row])

    def decide(self, group: Group, rows: GatheredRows) -> torch.Tensor:
        """The decision of each row (``SpanTables.decide_state``; ``-1`` everywhere where the group's
        tables hold nobody): its slot's span state, advanced over the drafts before the row."""
        tables = self.tables.get((group.level, type(group)))
        source = self._step
        if tables is None or source is None:  # (``-1``, or the group's own "none": ``scope.ScopedDecided``)
            return torch.full_like(rows.slot_of_row, getattr(group, "no_decision", -1))
        slots = rows.slot_of_row
        local_pos = self._inputs[1]
        if local_pos is None and self._decided and tables.rule != NO_RULE:  # decided in the fused advance
            return torch.where(rows.member, tables.decided[slots], tables.no_decision)
        if local_pos is None:
            return tables.decide_state(slots, None, lambda: source.total_len[source.clamped(slots)], rows.member,
                                       self.row_tokens)
        return tables.decide_drafted(self, rows, source, local_pos)

    @property
    def fused_step(self) -> bool:
        """Whether this step's advance was fused (``SpanTables.decided`` holds its rules' decisions)."""
        return self._decided

    def eager_drafts(self, tables: SpanTables, rows: GatheredRows, source: StepSource, local_pos: torch.Tensor) -> torch.Tensor:
        """``decide`` with drafts, eagerly: each row's slot state advanced over the drafts before it
        (per draft position the ops of ``SpanTables.advance``), then ``decide_state``."""
        slots = rows.slot_of_row
        state, valid = self.over_drafts(tables, rows, source, local_pos, tables.state[slots], rows.member)
        committed = source.total_len[source.clamped(slots)]
        return tables.decide_state(slots, state, lambda: committed + local_pos.long(), valid, self.row_tokens)

    def over_drafts(self, tables: SpanTables, rows: GatheredRows, source: StepSource, local_pos: torch.Tensor,
                     state: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``state`` (each row's, from its slot's) advanced over the drafts fed before the row, and
        whether the row may be decided (a ``member`` with no placeholder draft before it)."""
        slots = rows.slot_of_row
        input_ids = self._inputs[0]
        clamped = source.clamped(slots)
        committed = source.total_len[clamped]
        drafts = local_pos.long()
        width, later = tables.width, self.max_new - 1
        # each row's tokens: the last ``width`` committed ones of its slot, then the drafts fed before it
        tail = source.tokens[clamped[:, None], committed[:, None] + tables.offsets(width)]
        if input_ids is None or not later:
            fed = torch.full((len(slots), later), _PAD, dtype=torch.long, device=slots.device)  # matches nothing
        else:
            at = (self._arange(len(slots)) - drafts)[:, None] + self._arange(later + 1)[None, 1:]
            fed = input_ids.long()[at.clamp_(0, len(input_ids) - 1)]
        seen = torch.cat([tail.long(), fed], 1)
        before = self._arange(later + 1)[None, 1:] <= drafts[:, None]  # which of the drafts precede the row
        # a placeholder draft before the row: nothing is decided for it (its request is still in prefill)
        valid = member & ~((fed == PLACEHOLDER) & before).any(1)
        consts = tables.consts.dev[slots, : 2 * (width + STATE)].view(len(slots), 2, width + STATE)
        for j in range(1, later + 1):  # the drafts before each row, one position at a time
            tables.advance(state, consts, seen[:, j : j + width], committed + j, before[:, j - 1])
        return state, valid

    def _arange(self, n: int) -> torch.Tensor:
        """``arange(n)`` on the device, kept per ``n`` (a bounded cache)."""
        return cached_arange(self._aranges, n, self.device)
