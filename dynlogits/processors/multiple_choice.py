"""``multiple_choice``: the output is exactly one of the choices, then EOS: the processor, its template
and its resident group (decided on the host from each row's history where the adapter has it, vLLM's
V1 runner; else on the device from each row's first tokens, Model Runner V2).

Scoped to a phase (``scope.ScopedDecided``: ``scopable``, ``neutral_history``; ``floored``,
``apply_floored``), the choice is what the phase's stretch holds, as the hosted path's ``_own``: with
host histories each row in phase decided from its stretch and a row out of phase
(``neutral_history``) left as it is, neither filled nor counted as dead; from the token window each
row's first tokens are read from its floor (its stretch's start, at least the prompt's length) and a
row whose floor is past every position (out of phase) is no member."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeAlias, cast

import torch

from dynlogits.kernels import multiple_choice as multiple_choice_kernels
from dynlogits.kernels.multiple_choice import GATE, multiple_choice_keep_
from dynlogits.specs.builtin.multiple_choice import MultipleChoice, MultipleChoiceSpec

from .base import IndexCache, RealizeContext, first_stop
from .device_thinking import NEVER
from .entries import EntryTablesGroup
from .kept import INT_BYTES, Kept, deep_size, shallow_size
from .modes import OUT_OF_PHASE
from .ops import KeepOnly, RowOp, apply_op, fill_rows, row_runs
from .slots import NEG_INF, Dead, GatheredRows, ListedRows, SlotTable, StepInputs, Template, listed_positions
from .uploads import StepUpload

if TYPE_CHECKING:
    from .window import TokenWindow

__all__ = ["KIND", "MultipleChoiceGroup", "MultipleChoiceProcessor", "MultipleChoiceTemplate", "factory"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = MultipleChoiceSpec | MultipleChoice

KIND = "multiple_choice"


class _RowTables(NamedTuple):
    """A step's tables, per row of the layout (``MultipleChoiceGroup._rows_tables``)."""

    slots: torch.Tensor
    prefix: torch.Tensor  # [rows, entries, width]
    unused: torch.Tensor
    depth: torch.Tensor  # [rows, entries]
    at_least: torch.Tensor
    ids: torch.Tensor  # [rows, entries]: the id each entry allows (a gather and scatter index)
    #: the counting step's (``MultipleChoiceGroup._decide_by_count``): per row the flat indices in
    #: ``tokens`` of its first ``width`` generated positions (past the matrix: its last column)
    head_at: torch.Tensor
    #: ``[rows, width, entries]``: ``prefix`` widened and transposed, unused cells ``UNMATCHED``
    cells: torch.Tensor
    #: ``[rows, 1]``: ``prompt_len - 1``, the position a row's first generated token is sampled at
    #: (``clamp``'s lower bound: a prefill chunk's row counts as that one)
    low: torch.Tensor
    #: ``[rows, entries]``: ``depth + prompt_len - 1`` for an ``at_least`` entry, else ``EXACT``
    high: torch.Tensor
    #: ``[rows, entries]``: ``BIG * depth + depth + prompt_len - 1``, what a matching entry's sum
    #: equals (``-BIG`` for padding: below every sum)
    target: torch.Tensor
    #: ``tokens.shape[1]`` the flat indices were made for
    stride: int
    #: ``[rows]``: ``prompt_len`` (int64), each row's first generated position (the fused op's ``base``)
    first: torch.Tensor


#: ``_decide_by_count``'s weight of a count of equal cells: above every position (so ``BIG`` times a
#: count, at most ``EntryTablesGroup.MAX_WINDOW_CELLS``, plus a position fits int64)
BIG = 1 << 40
#: ``high`` of an entry that matches an output of its own length only: past every position
EXACT = 1 << 62
#: an unused prefix cell, widened: below every int32 token, however arbitrary
UNMATCHED = -(1 << 40)
#: token dtypes whose values never equal ``UNMATCHED``
_NARROW = (torch.int32, torch.int16, torch.uint8, torch.int8)


class MultipleChoiceGroup(EntryTablesGroup):
    """``multiple_choice`` decided on the device from each row's first generated tokens
    (``TokenWindow.head``): per slot an entry per edge of the choices' trie (the output that reaches
    the node, left-aligned in ``width`` columns, unused ones ``-1``, its length and one id the node
    allows next) plus one per whole choice followed by EOS (``at_least``: any longer output that
    begins with it allows EOS). A row keeps the ids of the entries its output matches: read, the
    row filled, written back with a ``scatter_reduce_`` (``amax``, ``-inf`` for the entries that do
    not match), as ``banned_phrases`` masks; a row that matches none (it left every choice) keeps
    none and fails. The tables: ``EntryTablesGroup``; the entries grow with the trie's edges, so a
    wide node costs one entry per id (100 one-token labels: 300 entries of 2 columns).

    With host histories (vLLM's V1 runner) each row's own processor walks its trie instead
    (``MultipleChoiceProcessor.allowed``) and the rows' allowed ids go up in one upload, kept with
    one ``index_select``, a fill of the rows and one ``index_copy_``."""

    restrictive = True
    positional = True  # a row left with no token reports its output position
    NEVER = 1 << 40  # ``depth`` of padding entries: never matches
    #: a member row out of a scoped entry's phase (``scope.ScopedDecided``): left as it is
    neutral_history = OUT_OF_PHASE
    floored = True
    #: a slot's entries grow with its choices' trie: written only once a scoped group decides from the window
    tables_at_first_window = True

    @classmethod
    def scopable(cls, template: Template) -> bool:
        """A scoped entry is resident: a row in phase decides from its stretch as from an output, and
        one out of phase (``neutral_history``) keeps its row as it is (``host_decision``: ``None``)."""
        return True

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self._neg_inf: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # per logits dtype and device

    def _new_tables(self) -> tuple[SlotTable, ...]:
        self.prefix = self.table(torch.int32, width=max(1, self.entries * self.width))
        self.depth = self.table(torch.long, width=max(1, self.entries))
        self.at_least = self.table(torch.bool, width=max(1, self.entries))
        self.ids = self.table(torch.long, width=max(1, self.entries))
        return self.prefix, self.depth, self.at_least, self.ids

    def _write_entries(self, slot: int, template: MultipleChoiceTemplate) -> None:
        w, pad = self.width, self.entries - len(template.prefixes)
        prefix: list[int] = []
        for p in template.prefixes:
            prefix += list(p) + [-1] * (w - len(p))
        self.prefix.set(slot, prefix + [-1] * (w * pad))
        self.depth.set(slot, [len(p) for p in template.prefixes] + [self.NEVER] * pad)
        self.at_least.set(slot, [int(a) for a in template.at_least] + [0] * pad)
        self.ids.set(slot, list(template.ids) + [template.ids[0]] * pad)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: each row's start in the flat logits (host)."""
        super().prepare(rows, stride)
        self._cache["base"] = (rows.rows * stride).tolist()

    def host_decisions(self, n: int) -> list[tuple[int, ...]]:
        return [()] * n

    def host_decision(self, processor: Any, history: Sequence[int]) -> tuple[int, ...] | None:
        """The ids the row allows this step (empty: it left every choice; ``None``: out of a scoped
        entry's phase, the row left as it is)."""
        if history is OUT_OF_PHASE:
            return None
        return processor.allowed(history)

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, decisions: list[tuple[int, ...] | None],
                             upload: StepUpload) -> Dead | None:
        """Each member row keeps only its ids: one upload of every row's allowed flat indices (padded
        to the widest, the witness of its emptiness) followed by those of the rows that keep any. A
        row decided ``None`` (out of its scoped entry's phase) is left out: then the rows in phase are
        filled, and their member indices go up in the same upload to select their slots, positions
        and stop indices for ``Dead``; no row in phase: nothing."""
        inside = [i for i, ids in enumerate(decisions) if ids is not None] if self.scoped else None
        if inside is not None and len(inside) == len(decisions):
            inside = None
        if inside is not None and not inside:
            return None
        bases = self._cache["base"]
        chosen = [(bases[i], decisions[i]) for i in inside] if inside is not None else list(zip(bases, decisions))
        width = max([1, *(len(ids) for _, ids in chosen if ids is not None)])
        witness: list[int] = []
        keep: list[int] = []
        for base, ids in chosen:
            assert ids is not None
            flat = [base + t for t in ids]
            keep += flat
            witness += flat + [flat[0] if flat else base] * (width - len(flat))
        n, k = len(witness), len(keep)
        extra = 0 if inside is None else len(inside)
        buf = upload.buffer(n + k + extra)
        buf[:n], buf[n : n + k] = witness, keep
        if inside is not None:
            buf[n + k :] = inside
        values = upload.upload(n + k + extra)
        kept_at = values[n : n + k]
        kept = step.flat.index_select(0, kept_at)
        witness_rows = values[:n].view(-1, width)
        if inside is None:
            fill_rows(step.logits, rows.runs, rows.rows_dev)
            step.flat.index_copy_(0, kept_at, kept)
            return Dead(rows.rows_dev, rows.slots_dev, witness_rows,
                        listed_positions(step, rows.rows_dev, rows.identity), rows.stop_index, rows.can_stop)
        at = values[n + k :]
        rows_dev = rows.rows_dev[at]
        fill_rows(step.logits, row_runs(rows.rows[inside].tolist()), rows_dev)
        step.flat.index_copy_(0, kept_at, kept)
        return Dead(rows_dev, rows.slots_dev[at], witness_rows, listed_positions(step, rows_dev),
                    None if rows.stop_index is None else rows.stop_index[at],
                    None if rows.can_stop is None else rows.can_stop[at])

    def _rows_tables(self, rows: GatheredRows, window: TokenWindow) -> _RowTables:
        """The rows' slots' tables, gathered once while ``rows.slot_of_row`` is the same tensor,
        ``window.tokens`` as wide and no table changes (a flush clears ``_cache``; the rows' prompt
        lengths are their slots' requests', so they hold as long)."""
        stride = window.tokens.shape[1]
        cached = self._cache.get("window")
        if cached is not None and cached[0] is rows.slot_of_row and cached[1].stride == stride:
            return cached[1]
        r, e, w = len(rows.slot_of_row), self.entries, self.width
        slots = window.slots(rows.slot_of_row)
        prefix = self.prefix.dev[rows.slot_of_row].view(r, e, w)
        depth, at_least = self.depth.dev[rows.slot_of_row], self.at_least.dev[rows.slot_of_row]
        prompt_len = window.prompt_len[slots].long()[:, None]
        columns = (prompt_len + torch.arange(w, device=slots.device)).clamp(max=stride - 1)
        unused = prefix < 0
        made = _RowTables(slots, prefix, unused, depth, at_least, self.ids.dev[rows.slot_of_row],
                          slots.long()[:, None] * stride + columns,
                          torch.where(unused, UNMATCHED, prefix.long()).transpose(1, 2).contiguous(),
                          prompt_len - 1, torch.where(at_least, depth + prompt_len - 1, EXACT),
                          torch.where(depth < self.NEVER, (BIG + 1) * depth.clamp(max=self.MAX_WINDOW_CELLS) + prompt_len - 1,
                                      -BIG),
                          stride, prompt_len[:, 0])
        self._cache["window"] = (rows.slot_of_row, made)
        return made

    def _fused_rows(self, rows: GatheredRows, window: TokenWindow) -> tuple[torch.Tensor, torch.Tensor]:
        """What the fused step needs per row beside the slots' tables: its output's first position
        (its prompt's length, the op's ``base``; the prompt lengths' dtype) and its slot's ids (the
        witness of a row left with none). Kept while ``rows.slot_of_row`` is the same tensor (a listed
        layout: none a step; with drafts the rows are gathered anew each step: three device ops), or
        taken from ``_rows_tables`` where those are made for it."""
        cached = self._cache.get("fused_rows")
        if cached is not None and cached[0] is rows.slot_of_row:
            return cached[1], cached[2]
        tables = self._cache.get("window")
        if tables is not None and tables[0] is rows.slot_of_row:
            first, ids = tables[1].first, tables[1].ids
        else:
            first, ids = window.prompt_len[window.slots(rows.slot_of_row)], self.ids.dev[rows.slot_of_row]
        self._cache["fused_rows"] = (rows.slot_of_row, first, ids)
        return first, ids

    def _fused_ids(self, rows: GatheredRows) -> torch.Tensor:
        """The rows' slots' ids alone (``_fused_rows``' second; a scoped step's bases are its floors),
        kept while ``rows.slot_of_row`` is the same tensor (with drafts: one ``index`` a step)."""
        cached = self._cache.get("fused_ids")
        if cached is not None and cached[0] is rows.slot_of_row:
            return cast(torch.Tensor, cached[1])
        ids = self.ids.dev[rows.slot_of_row]
        self._cache["fused_ids"] = (rows.slot_of_row, ids)
        return ids

    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Per row and entry (``[rows, entries]``): whether the row's output is the entry's (or, for an
        ``at_least`` entry, begins with it), so the entry's id is allowed now. A member row's
        decisions only: a row outside the group keeps its logits whatever they are (see
        ``apply_device_decisions``). Where ``GATE`` is ready (drafts or none), nothing: the fused op
        decides and keeps in ``apply_device_decisions``. Else, without drafts and with int32 tokens
        (vLLM's), ``_decide_by_count``; else the rows' first tokens from ``window.head`` compared cell
        by cell."""
        if GATE.ready(window.pos.device):  # the whole step: one fused op
            self._cache["fused"] = window
            return rows.member
        t = self._rows_tables(rows, window)
        if window.input_ids is None and window.tokens.dtype in _NARROW:
            return self._decide_by_count(t, window)
        return self._decide_from(t, window, None)

    def _decide_from(self, t: _RowTables, window: TokenWindow, first: torch.Tensor | None) -> torch.Tensor:
        """``decide_from_window`` cell by cell, each row's history from ``first[r]`` on (``None``: its
        output, from the prompt's length)."""
        head = window.head(t.slots, self.width, first)
        # tokens of its history before the row; a prefill chunk's row (its sample discarded) counts as the first
        start = window.prompt_len[t.slots] if first is None else first
        n = (window.pos - start + 1).long().clamp_(min=0)[:, None]
        same = ((t.prefix == head[:, None, :]) | t.unused).all(2)
        return same & ((t.depth == n) | (t.at_least & (t.depth <= n)))

    @staticmethod
    def _decide_by_count(t: _RowTables, window: TokenWindow) -> torch.Tensor:
        """``decide_from_window`` in six device ops: the rows' first ``width`` generated positions
        read at once (``take``: flat indices fixed per layout, past ``pos`` too, where the cells
        compared are unused ones), each entry's cells equal to them counted (``count``: an unused
        cell, ``UNMATCHED``, equals no int32 value), and ``pos`` clamped to ``[low, high]``
        (``z``): an entry matches iff ``z + BIG * count == target``, i.e. (``0 <= z < BIG``)
        ``count == depth`` (its whole prefix) and ``max(pos, low) == depth + prompt_len - 1``: ``n ==
        depth``, ``n`` the tokens generated before the row (at least 0), or for an ``at_least``
        entry ``n >= depth``."""
        head = torch.take(window.tokens, t.head_at)  # [rows, width]
        count = (t.cells == head[:, :, None]).sum(1)  # [rows, entries]
        z = torch.clamp(window.pos[:, None], min=t.low, max=t.high)
        return torch.add(z, count, alpha=BIG) == t.target

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, hit: torch.Tensor) -> Dead:
        """Each member row keeps only the ids of the entries it matched (none where it matched none):
        ``_keep``, or the fused op where ``decide_from_window`` left the step to it."""
        window = self._cache.pop("fused", None)
        if window is not None:
            first, ids = self._fused_rows(rows, window)
            return self._keep_fused(step, rows, ids, window, first, rows.member, rows.member)
        return self._keep(step, rows, self._cache["window"][1], hit, rows.member)

    def apply_floored(self, step: StepInputs, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor) -> Dead:
        """A scoped entry's rows (``scope.ScopedDecided``): each row's history from its floor on (at
        least its prompt's length: a span the prompt opened starts at the output, as the hosted
        path's ``_own``), cell by cell (``_decide_from``); a row whose floor is past every position
        (out of phase: ``device_thinking.NEVER``) is no member, its row left as it is. Where ``GATE``
        is ready (drafts or none), the fused op from that floor on: ``FloorScopeTables`` gives no
        floor below the prompt's length and none below ``NEVER`` but a member's, so the floors are
        the op's bases as they are and the rows it may leave with no token those below ``NEVER``
        (one ``lt``)."""
        if GATE.ready(window.pos.device):
            return self._keep_fused(step, rows, self._fused_ids(rows), window, floor, rows.member, floor < NEVER)
        t = self._rows_tables(rows, window)
        first = torch.maximum(floor, t.first)
        inside = rows.member & (floor < NEVER)
        return self._keep(step, rows, t, self._decide_from(t, window, first), inside)

    def _keep_fused(self, step: StepInputs, rows: GatheredRows, ids: torch.Tensor, window: TokenWindow,
                    first: torch.Tensor, member: torch.Tensor, inside: torch.Tensor) -> Dead:
        """The step as one fused op (``dynlogits::multiple_choice_keep_``, one launch on CUDA): each
        ``member`` row's history from ``first[r]`` on (past every position: out of phase, left as it
        is), the drafts fed before it from ``window.input_ids`` (``local_pos``), the slots' tables read
        as they are; a variant failing to compile on CUDA turns the kernel off (one warning) and
        ``_keep`` answers (``_decide_from``: the same reading). ``inside``: the rows it may leave with
        no token; ``ids``: the rows' slots' ids (``_fused_rows``)."""
        drafts = window.input_ids is not None and window.local_pos is not None
        args = (step.logits, window.tokens, first, window.pos, rows.slot_of_row, member, self.prefix.dev,
                self.depth.dev, self.at_least.dev, self.ids.dev, window.input_ids if drafts else None,
                window.local_pos if drafts else None, self.entries, self.width)

        def eager() -> None:
            t = self._rows_tables(rows, window)
            self._keep(step, rows, t, self._decide_from(t, window, first), inside)

        _gated(window.pos.device, args, eager)
        return Dead(None, rows.slot_of_row, ids, step.generated, where=inside)

    def _keep(self, step: StepInputs, rows: GatheredRows, t: _RowTables, hit: torch.Tensor, member: torch.Tensor) -> Dead:
        """The ``member`` rows keep only the ids of the entries ``hit`` (none where none): the
        entries' logits read (``-inf`` for the entries not hit), the member rows filled, the read ones
        written back (``amax``: an id two entries allow, or one a hit and a missed entry name, keeps
        its value; a row outside ``member`` gets its own values back, unchanged)."""
        key = (step.logits.dtype, step.logits.device)
        neg_inf = self._neg_inf.get(key)
        if neg_inf is None:
            neg_inf = self._neg_inf[key] = torch.full((), NEG_INF, dtype=key[0], device=key[1])  # a fill, no copy
        kept = torch.where(hit, step.logits.gather(1, t.ids), neg_inf)
        step.logits.masked_fill_(member[:, None], NEG_INF)
        step.logits.scatter_reduce_(1, t.ids, kept, reduce="amax")
        return Dead(None, rows.slot_of_row, t.ids, step.generated, where=member)


def _gated(device: torch.device, args: tuple[Any, ...], eager: Callable[[], None]) -> None:
    """``multiple_choice_keep_(*args)`` through ``GATE``: on CUDA named by its variant
    (``kernels.multiple_choice.variant``: ``BLOCK_W``, drafts, dtypes), so a variant not compiled yet
    compiles off the step and ``eager()`` answers until it lands."""
    GATE.run_named(device, lambda: multiple_choice_keep_(*args), eager, multiple_choice_kernels.variant, *args)


@dataclass(frozen=True, slots=True)
class MultipleChoiceTemplate(Template):
    """The choices as entries: the output ``prefixes[i]`` (from the first generated token) allows
    ``ids[i]`` next; an ``at_least[i]`` entry (a whole choice then EOS) also every longer output
    that begins with it. An output allows the ids of every entry it matches."""

    prefixes: tuple[tuple[int, ...], ...]
    ids: tuple[int, ...]
    at_least: tuple[bool, ...]
    group: ClassVar[type[MultipleChoiceGroup]] = MultipleChoiceGroup
    reads_tokens: ClassVar[bool] = True

    @property
    def geometry(self) -> tuple[int, int]:
        """Its entries and the longest prefix (at least 1)."""
        return len(self.prefixes), max(1, *map(len, self.prefixes))


#: Choice sets (with their EOS) whose tables are kept, least recently used dropped first: a choice
#: set repeated across requests costs a lookup at realization, not a build (256 choices of 64
#: tokens take tens of milliseconds to build). At most ``TABLES_KEPT`` sets holding at most
#: ``TABLES_BYTES`` bytes in all, their choices included (``_weight``): that largest set takes
#: ~11 MiB, a handful of short choices a few KiB.
TABLES_KEPT = 64
TABLES_BYTES = 32 << 20
_TABLES: Kept[tuple[Any, ...]] = Kept(TABLES_KEPT, TABLES_BYTES)


def _weight(key: tuple[Any, ...], tables: tuple[Any, ...]) -> int:
    """The bytes a choice set (the key) and its tables hold: ``deep_size(key)``, then the tables'
    own containers (``shallow_size``: a pass over the nodes, never over the ~500k ids the
    template's prefixes share with the key) and their ints, one node number per node."""
    children, ends, allowed, template = tables
    prefixes = dict(zip(map(id, template.prefixes), template.prefixes)).values()  # one per node
    return (deep_size(key) + INT_BYTES * len(children)
            + shallow_size((tables, children, ends, allowed, template, template.prefixes, template.ids, template.at_least))
            + shallow_size(children) + shallow_size(allowed) + shallow_size(prefixes))


class MultipleChoiceProcessor:
    """At each step only the next token of every choice the output still matches may be sampled,
    and ``eos`` once the output is a whole choice; once ``eos`` has followed a whole choice, ``eos``
    again (an engine that ignores EOS goes on); an output that matches no choice keeps no id (its
    request fails: no token left). A trie of the choices, walked from the root each step (at most
    the longest choice's length); each node's allowed ids are built once per choice set
    (``_TABLES``), their index once per processor."""

    __slots__ = ("_allowed", "_children", "_ends", "_eos", "_keep", "template")

    _children: list[dict[int, int]]  # the trie: each node's children by token
    _ends: list[bool]  # whether each node ends a choice
    _allowed: list[tuple[int, ...]]  # each node's allowed ids

    def __init__(self, choices: Sequence[Sequence[int]], eos_token_id: int) -> None:
        self._eos = eos_token_id
        self._keep: dict[tuple[int, ...], IndexCache] = {}
        try:
            key: tuple[Any, ...] = (choices, eos_token_id)
            hash(key)
        except TypeError:  # lists: made hashable
            key = (tuple(tuple(c) for c in choices), eos_token_id)
        self._children, self._ends, self._allowed, self.template = _TABLES.made(
            key, lambda: self._build(choices), lambda tables: _weight(key, tables))

    def _build(self, choices: Sequence[Sequence[int]]) -> tuple[Any, ...]:
        """The trie, each node's allowed ids and the template (shared read only, ``_TABLES``)."""
        eos_token_id = self._eos
        self._children = [{}]
        self._ends = [False]
        for choice in choices:
            node = 0
            for token in choice:
                child = self._children[node].get(token)
                if child is None:
                    child = self._children[node][token] = len(self._children)
                    self._children.append({})
                    self._ends.append(False)
                node = child
            self._ends[node] = True
        self._allowed = [tuple(sorted({*children, *((eos_token_id,) if end else ())}))
                         for children, end in zip(self._children, self._ends)]
        self.template = self._template()
        return self._children, self._ends, self._allowed, self.template

    def _template(self) -> MultipleChoiceTemplate:
        """The trie as entries (``MultipleChoiceTemplate``): one per id each node allows next, the
        nodes in the order a walk from the root meets them, then one per whole choice that EOS does
        not continue inside the trie."""
        prefixes: list[tuple[int, ...]] = []
        ids: list[int] = []
        done: list[tuple[int, ...]] = []
        stack: list[tuple[int, tuple[int, ...]]] = [(0, ())]
        while stack:
            node, prefix = stack.pop()
            allowed = self._allowed[node]
            prefixes += [prefix] * len(allowed)
            ids += allowed
            if self._ends[node] and self._eos not in self._children[node]:
                done.append(prefix + (self._eos,))
            stack.extend((child, prefix + (token,)) for token, child in self._children[node].items())
        at_least = [False] * len(ids) + [True] * len(done)
        return MultipleChoiceTemplate(tuple(prefixes + done), tuple(ids + [self._eos] * len(done)), tuple(at_least))

    def allowed(self, input_ids: Sequence[int]) -> tuple[int, ...]:
        """The ids this step allows (empty: the output left every choice)."""
        node = 0
        for token in input_ids:
            child = self._children[node].get(token)
            if child is None:
                return (self._eos,) if self._ends[node] and token == self._eos else ()
            node = child
        return self._allowed[node]

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        ids = self.allowed(input_ids)
        index = self._keep.get(ids)
        if index is None:  # one per trie node at most
            index = self._keep[ids] = IndexCache(ids)
        return KeepOnly(index)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)


def factory(entry: Entry, ctx: RealizeContext) -> MultipleChoiceProcessor:
    """A fresh processor for one ``multiple_choice`` entry (EOS: its own, else the request's stop
    token, ``first_stop``)."""
    eos = entry.eos_token_id if entry.eos_token_id is not None else first_stop(ctx)
    if eos is None:
        raise ValueError("multiple_choice needs an eos_token_id: the request has no stop token")
    return MultipleChoiceProcessor(entry.choices, eos)
