"""``no_repeat_ngram``: every token that would complete an n-gram of ``size`` tokens the history
already holds is masked, exactly as transformers' ``NoRepeatNGramLogitsProcessor(size)`` on that
history (the output, or the prompt and the output with ``include_prompt``): the processor.

Resident where the adapter gives the rows' histories on the host (vLLM's V1 runner): a
``NoRepeatNgramTemplate`` whose group decides every member row on the host from its processor's
index and masks what they find with one ``index_fill_`` of their flat ids (one upload on an
accelerator; no tensor per row). Where the histories live on the device (vLLM's Model Runner V2),
the same group decides every row on the device from the engine's token matrix
(``no_repeat_ngram_device``), no read back, for sizes up to ``MAX_DEVICE_SIZE``; larger sizes are
hosted there (per row, ``row_op``). Scoped to a phase (``scope.ScopedDecided``), the group decides
each row from its phase's stretch: on the host from the stretch of its history (out of phase from
the empty history: nothing), on the device from the engine's token matrix as above, no position
before the stretch's start counted (``apply_floored``: the same fused op with a per-row floor).

A row's index (``_Row``) is a graph of its keys (each ``size - 1`` tokens of the history, a
``_Node``): a key's links are the tokens that followed it, each leading to the key that token makes,
so a step that extends the history by a token follows (or adds) one link, one dict lookup, and
masks the new key's followers (kept per key until it gains one). The index is found by comparing
the history with the tokens it covers (a C-level list compare, no Python loop: whole, or its last
``TAIL_CHECKED`` tokens once ``WHOLE_COMPARED`` long when the history is the same list as at the
row's last step, as vLLM's V1 runner passes it; else all of them), then extended by the tokens
generated since. A history no kept index covers (the first call, another sample, a rejected draft)
is indexed from scratch once: ``O(len(history) * size)``. The prompt's n-grams (``include_prompt``)
are indexed once per request, at realization. On the V1 runner's steady step (every member's list
one token longer) the group steps all rows at once (``_Pass``): each part of the step is one pass over
the rows (compiled where ``no_repeat_ngram_pass_native`` loaded, else C-level ``map`` calls), which
read their scattered objects (cold after an engine's forward pass) with many loads in flight.

Placeholders: a negative id is a token not known yet (vLLM's ``-1`` in the newest slot under async
scheduling), never an id: an n-gram holding one is skipped, and a step whose last ``size - 1``
tokens hold one masks only what the n-grams without it say (for ``size > 1``: nothing)."""

from __future__ import annotations

import ctypes
from array import array
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter, getitem
from typing import Any, ClassVar, TypeAlias, cast

import numpy as np
import torch

from dynlogits.specs.builtin.no_repeat_ngram import NoRepeatNgram, NoRepeatNgramSpec

from . import no_repeat_ngram_pass_native as pass_native
from .base import IndexCache, RealizeContext
from .dry_lowering import host_f32_view
from .modes import Decider, WindowDecided
from .no_repeat_ngram_device import MAX_DEVICE_SIZE, Layout, SlotTables, apply, layout, slot_tables, window_width
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, GatheredRows, Group, ListedRows, StepInputs, Template
from .uploads import StepUpload
from .window import TokenWindow

__all__ = ["KEPT_ROWS", "KIND", "TAIL_CHECKED", "WHOLE_COMPARED", "NoRepeatNgramGroup", "NoRepeatNgramProcessor",
           "NoRepeatNgramTemplate", "banned_after", "factory"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = NoRepeatNgramSpec | NoRepeatNgram

KIND = "no_repeat_ngram"

#: Row indexes one processor keeps (samples, beams, draft rows of its request), the least recently
#: used dropped first; a row whose index was dropped is indexed again from its history.
KEPT_ROWS = 16
#: Tokens before the covered end compared when a row's history is the list its index was last read
#: from (a list an engine grows) and at least ``WHOLE_COMPARED`` long: a rewrite deeper than this in
#: such a list goes unseen.
TAIL_CHECKED = 64
#: Histories shorter than this that are the list an index was last read from are compared whole (on
#: the common step a C-level compare of pointers, no token object read: up to here cheaper than
#: slicing ``TAIL_CHECKED`` tokens, which touches each), longer ones on their last ``TAIL_CHECKED``.
WHOLE_COMPARED = 256
#: Distinct sets of ids one request masks, whose index tensors are kept (beyond it, rebuilt).
KEPT_SETS = 64

#: (the ``size - 1`` tokens before a position) -> the tokens that followed them
Index: TypeAlias = dict[tuple[int, ...], set[int]]


def _add(index: Index, before: tuple[int, ...], token: int) -> None:
    followers = index.get(before)
    if followers is None:
        index[before] = {token}
    else:
        followers.add(token)


def _index(tokens: Sequence[int], size: int) -> Index:
    """The n-grams of ``tokens`` that hold no placeholder."""
    index: Index = {}
    last_placeholder = -1
    for end, token in enumerate(tokens):
        if token < 0:
            last_placeholder = end
        elif end >= size - 1 and last_placeholder <= end - size:
            _add(index, tuple(tokens[end - size + 1:end]), token)
    return index


def banned_after(history: Sequence[int], size: int) -> set[int]:
    """What transformers' ``NoRepeatNGramLogitsProcessor(size)`` masks after ``history``, n-grams
    holding a placeholder skipped: a plain scan (the reference; the processor indexes instead)."""
    n = len(history)
    if n < size - 1:
        return set()
    before = tuple(history[n - size + 1:]) if size > 1 else ()
    if any(t < 0 for t in before):
        return set()
    return _index(history, size).get(before, set())


#: The ``next`` of every node without a link (never written: a node gets its own dict at its first).
NO_LINKS: dict[int, _Node] = {}


class _Node:
    """One key of a row's index (``size - 1`` tokens, no placeholder): ``next`` maps each token
    that followed it in the row's tokens to the node of the key that token makes (the key shifted
    by it; size 1: itself), so its keys are the key's followers; ``ids``: what the key masks (sorted,
    inside the logits width, the prompt's followers included), ``None`` until read and whenever
    ``next`` gains a token; ``flat``: those ids plus ``base`` (the row's start in the flat logits,
    ``NoRepeatNgramGroup``'s pass) as native int64 bytes, valid while ``base`` is the start of the
    layout the pass runs (``None`` whenever ``ids`` is); ``token`` and ``to``: its newest link and
    the node it leads to (``None`` while it has none), the pass's guess at the row's next step."""

    __slots__ = ("key", "next", "ids", "flat", "base", "token", "to")

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key = key
        self.next: dict[int, _Node] = NO_LINKS  # its own dict from its first link on
        self.ids: tuple[int, ...] | None = None
        self.flat = b""
        self.base: int | None = None
        self.token: int | None = None
        self.to: _Node | None = None


class _Row:
    """One history's index: ``tokens``, a copy of the history's tokens up to its first placeholder,
    ``nodes``, its keys (the n-grams ending in ``tokens`` are their ``next`` links), ``node``, the
    key of ``tokens``' end (the prompt's last tokens before them with ``include_prompt``; ``None``
    while prompt and tokens are shorter than ``size - 1`` or it holds a prompt placeholder), the
    next token's n-gram prefix (``None`` too while a ``NoRepeatNgramGroup`` pass steps the row: it is
    found again from ``tokens``), and ``source``, the list it was last read from (an engine's live
    history: vLLM's V1 runner hands each row the same growing list). A step that adds a token whose
    n-gram is known follows one link (one dict lookup); a new n-gram adds a link."""

    __slots__ = ("tokens", "nodes", "node", "source")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.nodes: dict[tuple[int, ...], _Node] = {}
        self.node: _Node | None = None
        self.source: list[int] | None = None

    def reset(self) -> None:
        """Forget everything: the next read indexes the history from scratch."""
        self.tokens, self.nodes, self.node, self.source = [], {}, None, None


class NoRepeatNgramProcessor:
    """Every step, each token that would complete an n-gram of ``size`` tokens already in
    ``prompt + history`` is masked (``prompt``: empty unless the entry includes it).

    Stateless for its callers: one instance serves every row of its request, in any order, each
    with its own history; what it keeps (an index per history, ``KEPT_ROWS`` at most) is a cache
    keyed by the history's tokens, checked against them at every call."""

    __slots__ = ("size", "vocab_size", "template", "_prompt", "_prompt_index", "_rows", "_sets")

    def __init__(self, size: int, vocab_size: int, prompt: Sequence[int] = (), *, positions: int | None = None,
                 outputs: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size, self.vocab_size = size, vocab_size
        self._prompt = tuple(prompt)
        self._prompt_index = _index(self._prompt, size) if self._prompt else {}
        self._rows: list[_Row] = []  # most recently used first
        self._sets: dict[tuple[int, ...], IndexCache] = {}
        self.template = NoRepeatNgramTemplate(size, bool(self._prompt), positions, outputs)

    def _row_for(self, history: list[int]) -> _Row:
        """The kept index whose tokens begin ``history`` (made most recent), extended to its first
        placeholder; a fresh one when none does. A history is compared whole with an index's tokens,
        except the list the index was last read from once it is ``WHOLE_COMPARED`` long: engines
        append to it (and put a placeholder's token in its place), so its last ``TAIL_CHECKED``
        covered tokens are compared."""
        n = len(history)
        for i, row in enumerate(self._rows):
            k = len(row.tokens)
            if k > n:
                continue
            if history is row.source:
                if k < WHOLE_COMPARED:
                    same = history[:k] == row.tokens
                else:
                    same = history[k - TAIL_CHECKED:k] == row.tokens[k - TAIL_CHECKED:]
            else:
                same = (k == 0 or history[k - 1] == row.tokens[-1]) and history[:k] == row.tokens
            if same:
                if i:
                    self._rows.insert(0, self._rows.pop(i))
                break
        else:
            row = _Row()
            self._rows.insert(0, row)
            del self._rows[KEPT_ROWS:]
        row.source = history
        self._extend(row, history)
        return row

    def _key_node(self, row: _Row) -> _Node | None:
        """The node of the last ``size - 1`` tokens of the prompt and ``row.tokens`` (made if new);
        ``None`` while they are fewer or hold a (prompt) placeholder."""
        need, tokens, prompt = self.size - 1, row.tokens, self._prompt
        n = len(tokens)
        if n >= need:
            key = tuple(tokens[n - need:])
        elif len(prompt) + n >= need:
            key = (*prompt[len(prompt) + n - need:], *tokens)
            if min(key) < 0:
                return None
        else:
            return None
        node = row.nodes.get(key)
        if node is None:
            node = row.nodes[key] = _Node(key)
        return node

    def _link(self, row: _Row, node: _Node, token: int) -> _Node:
        """The n-gram ``node.key + (token,)``, new: ``node`` gains the link (its ids dropped); the node
        ``token`` leads to (made if new)."""
        if self.size == 1:
            to = node
        else:
            key = (*node.key[1:], token)
            to = row.nodes.get(key)  # type: ignore[assignment]
            if to is None:
                to = row.nodes[key] = _Node(key)
        if node.next is NO_LINKS:
            node.next = {token: to}
        else:
            node.next[token] = to
        node.ids = node.base = None
        node.token, node.to = token, to
        return to

    def _extend(self, row: _Row, history: list[int]) -> None:
        tokens, node = row.tokens, row.node
        if node is None:  # not known yet, or dropped by a pass of ``NoRepeatNgramGroup`` that stepped the row
            node = self._key_node(row)
        for j in range(len(tokens), len(history)):
            token = history[j]
            if token < 0:
                break
            tokens.append(token)
            if node is not None:
                to = node.next.get(token)
                node = self._link(row, node, token) if to is None else to
            else:  # fewer than ``size - 1`` tokens so far, or a prompt placeholder among them
                node = self._key_node(row)
        row.node = node

    def banned(self, history: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks (sorted, no repeats, inside the logits width)."""
        h = history if type(history) is list else list(history)
        rows = self._rows
        if rows and h is rows[0].source:  # the common step (``NoRepeatNgramGroup``'s pass takes it too)
            node = self._stepped(rows[0], h)
            if node is not None:
                ids = node.ids
                return self._ids(node) if ids is None else ids
        return self._banned(h)

    def _stepped(self, row: _Row, h: list[int]) -> _Node | None:
        """The common step: ``h`` is the list ``row`` was last read from, one known token longer
        (its covered tokens unchanged, compared as ``_row_for`` compares them): ``row`` advanced
        along that token, its node returned; else ``None`` and ``row`` as it was."""
        tokens, node = row.tokens, row.node
        k = len(tokens)
        if node is None or len(h) != k + 1:
            return None
        token = h[k]
        if token < 0:
            return None
        tokens.append(token)
        if h == tokens if k < WHOLE_COMPARED else h[k - TAIL_CHECKED:k] == tokens[k - TAIL_CHECKED:k]:
            to = node.next.get(token)
            node = row.node = self._link(row, node, token) if to is None else to
            return node
        tokens.pop()
        return None

    def _banned(self, h: list[int]) -> tuple[int, ...]:
        row = self._row_for(h)
        n, known = len(h), len(row.tokens)
        if known < n:  # a placeholder at ``known``
            if known < n - 1:
                return tuple(sorted(t for t in self._scan(h) if t < self.vocab_size))
            if self.size > 1:
                return ()
        node = row.node
        if node is None:
            return ()
        ids = node.ids
        return self._ids(node) if ids is None else ids

    def _ids(self, node: _Node) -> tuple[int, ...]:
        """What ``node``'s key masks (the prompt's n-grams included), kept in ``node.ids``."""
        found: Collection[int] = node.next
        early = self._prompt_index.get(node.key) if self._prompt_index else None
        if early:
            found = early.union(found)
        vocab = self.vocab_size
        ids = node.ids = tuple(sorted(t for t in found if t < vocab)) if found else ()
        return ids

    def _scan(self, history: list[int]) -> set[int]:
        """A history with a placeholder before its newest slot (no engine makes one): scanned whole."""
        return banned_after([*self._prompt, *history], self.size)

    def row_op(self, history: Sequence[int]) -> RowOp | None:
        ids = self.banned(history)
        if not ids:
            return None
        index = self._sets.get(ids)
        if index is None:
            if len(self._sets) >= KEPT_SETS:
                self._sets.clear()
            index = self._sets[ids] = IndexCache(ids)
        return MaskIds(index)

    def __call__(self, history: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(history), logits)


class NoRepeatNgramGroup(WindowDecided):
    """``no_repeat_ngram`` on the resident path. Where the adapter passes host histories
    (``SlotBatch(host_histories=True)``, vLLM's V1 runner): every member row is decided on the host
    from its processor's index, all rows at once on the steady step (``_Pass``), else row by row
    (``_each``); the ids found become flat indices (native int64 bytes), read in place on the CPU or
    uploaded once, and masked with one ``index_fill_``; no device tables. From the token window
    (Model Runner V2): every row decided on the device (``no_repeat_ngram_device``) from its slot's
    table (``params``: size, whether the prompt counts), for sizes up to ``MAX_DEVICE_SIZE``
    (``fits_window``; larger ones hosted), masked with one ``scatter_reduce_``. Masks only: never
    leaves a row empty by itself."""

    @classmethod
    def scopable(cls, template: Template) -> bool:
        """A scoped entry is resident with host histories (``scope.ScopedDecided``): a row decides
        from any history, the empty one (``neutral_history``) bans nothing without the prompt's
        n-grams (``include_prompt``, which the spec refuses with a scope: hosted)."""
        assert isinstance(template, NoRepeatNgramTemplate)
        return not template.include_prompt

    @classmethod
    def fits_window(cls, template: Template, group: Group | None) -> bool:
        """Sizes up to ``MAX_DEVICE_SIZE``: each step compares ``rows * W * size`` cells (``no_repeat_ngram_device``)."""
        assert isinstance(template, NoRepeatNgramTemplate)
        return template.size <= MAX_DEVICE_SIZE

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.params = self.table(torch.long, pad=0, width=2)
        self._sizes: dict[int, int] = {}  # member slot -> size, window groups
        self._spans: dict[int, int | None] = {}  # member slot -> its longest kept history (None: unknown), window groups
        self.width: int | None = None  # the window the last layout reads (``window_width``), window groups
        self._extremes: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self._index: tuple[torch.Tensor, memoryview, dict[int, torch.Tensor]] | None = None  # CPU, host histories

    def _write(self, slot: int, template: NoRepeatNgramTemplate) -> None:
        if not self.from_window:
            return None  # decided on the host: everything it reads is the row's history and its processor's index
        self.params.set(slot, [template.size, int(template.include_prompt)])
        self._sizes[slot] = template.size
        self._spans[slot] = template.positions if template.include_prompt else template.outputs
        return None

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:
            self._sizes.pop(slot, None)
            self._spans.pop(slot, None)
        super().assign(slot, template)

    # -- token window (Model Runner V2) -------------------------------------------------------------
    def _layout(self, rows: GatheredRows, window: TokenWindow, vocab: int) -> Layout:
        """The rows' tables: every slot's (``no_repeat_ngram_device.slot_tables``) made once while no
        table changes (a flush clears ``_cache``) and the logits are as wide, gathered by one
        ``index`` while ``rows.slot_of_row`` is the same tensor (under drafts the runner gives a new
        one every step)."""
        cached: Layout | None = self._cache.get("rows")
        if cached is not None and cached.slot_of_row is rows.slot_of_row and cached.source.vocab == vocab:
            return cached
        tables: SlotTables | None = self._cache.get("slots")
        if tables is None or tables.vocab != vocab:
            size = max(self._sizes.values(), default=1)
            self.width = width = window_width(window.tokens.shape[1], list(self._spans.values()), size)
            tables = self._cache["slots"] = slot_tables(window, self.member.dev[:, 0], self.params.dev, width, size, vocab)
        made = self._cache["rows"] = layout(tables, rows.slot_of_row)
        return made

    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Nothing yet: the rows are decided where the logits' width is known
        (``apply_device_decisions``), from ``window``, kept until then; the rows' membership stands
        for the decisions (no device op)."""
        self._cache["window_step"] = window
        return rows.member

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, decisions: torch.Tensor) -> None:
        """Every row decided from the window and its bans masked (``no_repeat_ngram_device.apply``)."""
        return self._ban(step, rows, self._cache.pop("window_step"), None)

    def _ban(self, step: StepInputs, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor | None) -> None:
        logits = step.logits
        apply(window, self._layout(rows, window, logits.shape[1]), logits, self._extremes_of(logits), floor)
        return None

    def _extremes_of(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``-inf`` and ``+inf`` in ``logits``' dtype, on its device (kept)."""
        key = (logits.dtype, logits.device)
        extremes = self._extremes.get(key)
        if extremes is None:
            extremes = self._extremes[key] = (torch.full((), NEG_INF, dtype=key[0], device=key[1]),
                                              torch.full((), -NEG_INF, dtype=key[0], device=key[1]))
        return extremes

    # -- a scoped entry without host histories (``scope.ScopedDecided``) ----------------------------
    floored = True

    def apply_floored(self, step: StepInputs, rows: GatheredRows, window: TokenWindow, floor: torch.Tensor) -> None:
        """Every row decided from ``window`` as ``apply_device_decisions`` decides it, no position
        below ``floor[r]`` counted (``no_repeat_ngram_device.apply``: on CUDA the one fused op), so
        the window is the unscoped group's (``window_width``), whatever ``max_tokens`` is."""
        return self._ban(step, rows, window, floor)

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: each member row's start in the flat logits (host), and the index each row
        was last decided from (none yet)."""
        super().prepare(rows, stride)
        self._cache["base"] = (rows.rows * stride).tolist()
        self._cache["held"] = [None] * len(rows.rows)

    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> bytes:
        """The flat indices the member rows mask this step, as native int64 bytes; a row whose
        processor raises is passed to ``fail`` and masks nothing. While every member row's history
        is the list its index was last read from, one token longer (the V1 runner's steady step),
        all of them are stepped at once (``_Pass``); else each row on its own (``_each``), after
        which the pass is set up again."""
        cache = self._cache
        run: _Pass | None = cache.get("pass")
        if run is not None:
            found = run.step(histories)
            if found is not None:
                return found
            cache["pass"] = None
        flat = self._each(deciders, histories, fail)
        cache["pass"] = _Pass.start(deciders, histories, cache["held"], cache["base"])
        try:
            return array("q", flat).tobytes()
        except TypeError:  # an id that is no int (a processor's history of other numbers), as numpy casts it
            return np.asarray(flat, dtype=np.int64).tobytes()

    def _each(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
              fail: Callable[[int, int, Exception], None]) -> list[int]:
        """Row by row: a history that is the list its index was last read from, one token longer,
        stepped here (``NoRepeatNgramProcessor.banned``'s common step, inlined), any other by the
        row's processor."""
        found: list[int] = []
        add = found.append
        held: list[_Row | None] = self._cache["held"]
        for i, (base, (row, slot, processor)) in enumerate(zip(self._cache["base"], deciders)):
            try:
                h = histories[row]
                index = held[i]
                if index is not None and h is index.source:
                    node = processor._stepped(index, h)
                    if node is not None:
                        ids = node.ids
                        if ids is None:
                            ids = processor._ids(node)
                        for t in ids:
                            add(base + t)
                        continue
                ids = processor.banned(h)
                held[i] = processor._rows[0]
            except Exception as exc:  # a bug must not escape the sampler: this row alone
                held[i] = None
                fail(row, slot, exc)
                continue
            for t in ids:
                add(base + t)
        return found

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, found: bytes, upload: StepUpload) -> None:
        """One masked write of the flat indices ``decide_rows`` found: on the CPU, float32 logits and
        at most ``HOST_WRITES_MAX`` ids written ``-inf`` one by one through a float32 view of the
        logits' memory (``dry_lowering.host_f32_view``: no tensor op, whose first call after the
        logits' copy misses the cache); else by one ``index_fill_``, its index read in place on the
        CPU, else through ``upload`` (one non-blocking copy)."""
        n = len(found) >> 3
        if n:
            if self.device.type == "cpu":
                flat = step.flat
                if n <= HOST_WRITES_MAX and flat.dtype is torch.float32 and flat.stride(0) == 1:
                    view = host_f32_view(flat)
                    for i in memoryview(found).cast("q"):
                        view[i] = NEG_INF
                    return None
                index = self._host_index(found, n)
            else:
                upload.buffer(n).data.cast("B")[:] = found  # native int64 into the int64 buffer
                index = upload.upload(n)
            step.flat.index_fill_(0, index, NEG_INF)
        return None

    def _host_index(self, found: bytes, n: int) -> torch.Tensor:
        """CPU: ``found`` copied into this group's index tensor (rewritten every step: a CPU op has
        run when it returns), its first ``n`` values; a view per count, kept."""
        held = self._index
        if held is None or n > held[0].shape[0]:
            tensor = torch.zeros(max(n, 256 if held is None else 2 * held[0].shape[0]), dtype=torch.long)
            held = self._index = (tensor, tensor.numpy().data.cast("B"), {})
        tensor, raw, views = held
        raw[:len(found)] = found
        view = views.get(n)
        if view is None:
            if len(views) >= 256:
                views.clear()
            view = views[n] = tensor[:n]
        return view


#: Ids past which CPU float32 logits are masked by one ``index_fill_`` rather than one by one.
HOST_WRITES_MAX = 128

_next_of, _flat_of, _base_of = attrgetter("next"), attrgetter("flat"), attrgetter("base")
_token_of, _to_of = attrgetter("token"), attrgetter("to")
_append, _pop = list.append, list.pop
#: Parts ``bytes.join`` joins without allocating (CPython's ``NB_STATIC_BUFFERS``).
JOINED = 10


def _joined(parts: list[bytes]) -> bytes:
    """``b"".join(parts)``, ten at a time: a join of more than ten parts mallocs a buffer table
    (80 bytes a part) past the small-object allocator, which after an engine's large frees can cost
    page faults (tens of µs per step where a join of 64 costs a few)."""
    while len(parts) > JOINED:
        parts = [b"".join(parts[i:i + JOINED]) for i in range(0, len(parts), JOINED)]
    return b"".join(parts)


class _Pass:
    """``NoRepeatNgramGroup``'s step of every member row at once, while each row's history is the
    list its index was last read from, one token longer, with no placeholder. Each part of the step
    is one pass over the rows (compiled where ``no_repeat_ngram_pass_native`` loaded, else C-level
    ``map`` calls and list compares), so the rows' scattered objects are read with many loads in
    flight rather than one row's chain at a time, and the step touches few objects per row: the
    history and its new token, the mirror, and the node the row moves to with its ``flat`` ids and
    newest link. The rows' own indexes (``_Row``) are stepped in place: their ``tokens`` are this
    pass's mirrors (short ones copied together at the start, so they lie close in memory), their
    ``node`` is dropped at the start (the pass keeps the current nodes; the processor finds a row's
    node again from its tokens), so a row is right for its processor whenever the pass stops.

    A step: ``histories`` holds the same lists as at the start (one identity compare); each one's
    last token (none negative) is appended to its mirror, which is then compared with the history
    (whole while every mirror is shorter than ``WHOLE_COMPARED``, which compares the lengths too;
    else the lengths and the last ``TAIL_CHECKED`` covered tokens, as the processor compares them);
    each row moves along its node's link for the token: where every token is its node's newest link
    (``guessed``; one compare of the rows' tokens) along those links, else by each node's ``next``
    (a new n-gram links it, row by row); then it masks that node's ``flat`` ids (made for the row's
    base, row by row, when stale). Any other history, a placeholder or a rewritten tail ends the
    pass (``None``, the mirrors as they were): the group decides that step row by row."""

    __slots__ = ("histories", "sources", "mirrors", "rows", "processors", "plain", "bases", "last", "nodes", "tokens",
                 "guessed", "longest", "native", "read", "guess", "spare", "out", "at")

    def __init__(self, histories: list[Sequence[int]], rows: list[_Row], processors: list[NoRepeatNgramProcessor],
                 bases: list[int], nodes: list[_Node]) -> None:
        self.histories = histories.copy()
        self.sources = cast(tuple[list[int], ...], tuple(index.source for index in rows))  # none is None: ``start``
        self.mirrors = tuple(index.tokens for index in rows)
        self.rows, self.processors, self.bases, self.nodes = rows, processors, bases, nodes
        #: per row: ``None`` for size 1 (a node links to itself), else whether its prompt has no n-grams
        self.plain = [None if p.size == 1 else not p._prompt_index for p in processors]
        self.last = [-1] * len(rows)
        self.longest = max(map(len, self.mirrors))
        #: the rows' guesses: their nodes' newest links' tokens (Python's pass) and the nodes they lead to
        self.tokens: list[int | None] = list(map(_token_of, nodes))
        self.guessed: list[_Node | None] = list(map(_to_of, nodes))
        #: the compiled reads (``no_repeat_ngram_pass_native.functions``; ``None``: the pass in Python)
        #: and their buffers: the new tokens, the guessed tokens, a spare list for the next guesses,
        #: the flat ids and their addresses
        self.native: tuple[Any, Any] | None = None
        self.read = self.guess = array("q")
        self.spare: list[_Node | None] = []
        self.out = bytearray()
        self.at = (0, 0, 0)
        self._compiled()

    @classmethod
    def start(cls, deciders: list[Decider], histories: Sequence[Sequence[int]], held: list[_Row | None],
              bases: list[int]) -> _Pass | None:
        """A pass over the rows ``_each`` has just decided, if each row's index (one per row) now
        covers its whole history, read from that same list, and has a node."""
        if not deciders or type(histories) is not list:
            return None
        rows: list[_Row] = []
        nodes: list[_Node] = []
        for (row, _, _), index in zip(deciders, held):
            if index is None or index.node is None or index.source is not histories[row] or len(index.tokens) != len(index.source):
                return None
            rows.append(index)
            nodes.append(index.node)
        if len(set(map(id, rows))) < len(rows):
            return None
        for index in rows:
            if len(index.tokens) <= WHOLE_COMPARED:
                index.tokens = index.tokens.copy()  # made together: the mirrors' headers and items lie close
            index.node = None  # the pass keeps it from now on
        return cls(histories, rows, [processor for _, _, processor in deciders], bases, nodes)

    def _compiled(self) -> tuple[Any, Any] | None:
        """The compiled reads once loaded (asked at every step until then), their buffers made from
        the Python pass's guesses."""
        native = pass_native.functions()
        if native is not None and pass_native.slot_table(_Node):
            n = len(self.rows)
            self.read = array("q", bytes(8 * n))
            self.guess = array("q", [t if type(t) is int and 0 <= t < 1 << 63 else -1 for t in self.tokens])
            self.spare = [None] * n
            self._grow(8 * 64 * n)
            self.native = native
        return self.native

    def _grow(self, size: int) -> None:
        self.out = bytearray(size)
        address = pass_native.address
        self.at = (address(self.read), address(self.guess), address(self.out))

    def step(self, histories: Sequence[Sequence[int]]) -> bytes | None:
        if histories != self.histories:  # the same lists, compared by identity
            return None
        native = self.native or self._compiled()
        if native is not None:
            read = native[0]
            tail = 0 if self.longest < WHOLE_COMPARED else TAIL_CHECKED
            if read(len(self.rows), self.sources, self.mirrors, tail, self.at[0]) != -1:
                return None
            return self._moved(None)
        hs = self.sources
        try:
            tokens: list[int] = list(map(getitem, hs, self.last))
            if min(tokens) < 0:
                return None
        except Exception:  # an empty history, or one the processor would refuse: row by row, each failing alone
            return None
        mirrors = self.mirrors
        deque(map(_append, mirrors, tokens), 0)
        if self.longest < WHOLE_COMPARED:
            same = hs == mirrors
        else:
            cut = [slice(k - TAIL_CHECKED - 1 if k > TAIL_CHECKED else 0, k - 1) for k in map(len, mirrors)]
            same = (list(map(len, hs)) == list(map(len, mirrors))
                    and list(map(getitem, hs, cut)) == list(map(getitem, mirrors, cut)))
        if not same:
            deque(map(_pop, mirrors), 0)
            return None
        return self._moved(tokens)

    def _moved(self, tokens: list[int] | None) -> bytes | None:
        """``_move`` (``tokens``: the rows' new tokens; ``None``: the compiled read's), its failure
        ending the pass."""
        try:
            found = self._move(tokens) if tokens is not None else self._move_compiled()
        except Exception:  # an id no index should hold: these rows are indexed again from their histories
            for index in self.rows:
                index.reset()
            return None
        self.longest += 1
        return found

    def _move(self, tokens: list[int]) -> bytes:
        """Every row along its node's link for its token (the mirrors hold it already); what they mask."""
        nodes = cast(list[_Node], self.guessed) if tokens == self.tokens else self._follow(tokens)  # guessed: no None
        if list(map(_base_of, nodes)) != self.bases:  # flat ids made for another layout, or none
            self._rebase(nodes)
        self.nodes, self.tokens, self.guessed = nodes, list(map(_token_of, nodes)), list(map(_to_of, nodes))
        return _joined(list(map(_flat_of, nodes)))

    def _move_compiled(self) -> bytes:
        """``_move`` with the rows' nodes read in C (``ngram_gather``): their flat ids copied out and
        their newest links taken as the next guesses, into the spare list (then the nodes' list or the
        guesses' the next spare)."""
        gather = cast(tuple[Any, Any], self.native)[1]
        n = len(self.rows)
        guessed = self.read == self.guess
        nodes = cast(list[_Node], self.guessed) if guessed else self._follow(list(map(getitem, self.sources, self.last)))
        for _ in range(3):  # at most one rebase and one larger buffer
            got: int = gather(n, nodes, self.bases, _Node, pass_native.slot_table(_Node), self.spare, self.at[1], self.at[2], len(self.out))
            if got >= 0:
                break
            if got == -1 - n:
                self._grow(2 * sum(map(len, map(_flat_of, nodes))))
            else:
                self._rebase(nodes)
        else:
            raise RuntimeError("no_repeat_ngram: the compiled gather refused its rows")
        spare = self.nodes if guessed else cast(list[_Node], self.guessed)
        self.nodes, self.guessed, self.spare = nodes, self.spare, cast(list[_Node | None], spare)
        return ctypes.string_at(self.at[2], got)

    def _follow(self, tokens: list[int]) -> list[_Node]:
        """Every row's node along its ``next`` link for its token; a new n-gram links it."""
        nexts = list(map(_next_of, self.nodes))
        found: list[_Node | None] = list(map(dict.get, nexts, tokens))
        if None in found:  # new n-grams (under the ban, every row's every step)
            for i, to in enumerate(found):
                if to is None:
                    found[i] = self._link(i, nexts[i], tokens[i])
        return cast(list[_Node], found)

    def _rebase(self, nodes: list[_Node]) -> None:
        """The rows' ``flat`` ids made for their bases where made for another layout, or not made."""
        bases = self.bases
        for i, node in enumerate(nodes):
            if node.base is not bases[i]:
                ids = node.ids
                if ids is None:
                    ids = self.processors[i]._ids(node)
                base = bases[i]
                node.flat = array("q", [base + t for t in ids]).tobytes() if ids else b""
                node.base = base

    def _link(self, i: int, follows: dict[int, _Node], token: int) -> _Node:
        """Row ``i``'s new n-gram (``NoRepeatNgramProcessor._link``, inlined), from the node whose
        ``next`` is ``follows``; a node it makes masks nothing but the prompt's (its flat ids made
        here for the row's base where the prompt has none)."""
        node = self.nodes[i]
        plain = self.plain[i]
        if plain is None:  # size 1
            to = node
        else:
            nodes = self.rows[i].nodes
            key = (*node.key[1:], token)
            made = nodes.get(key)
            if made is None:
                made = nodes[key] = _Node(key)
                if plain:
                    made.ids, made.base = (), self.bases[i]  # flat b"": nothing to mask, whatever the base
            to = made
        if follows is NO_LINKS:
            node.next = {token: to}
        else:
            follows[token] = to
        node.ids = node.base = None
        node.token, node.to = token, to
        return to


@dataclass(frozen=True, slots=True)
class NoRepeatNgramTemplate(Template):
    """Every step: the ids that would complete an n-gram of ``size`` tokens the row's history holds
    (the prompt's too with ``include_prompt``), decided per row on the host from histories, else on
    the device from the token window."""

    size: int
    include_prompt: bool = False
    #: the most positions a row of the request reaches (prompt plus ``max_tokens``; ``None``: unknown)
    #: and the most tokens it generates (``max_tokens``): the window decided on the device is no wider
    #: than the longest history its members' kept samples see (``no_repeat_ngram_device.window_width``)
    positions: int | None = None
    outputs: int | None = None
    group: ClassVar[type[NoRepeatNgramGroup]] = NoRepeatNgramGroup
    reads_tokens: ClassVar[bool] = True


def factory(entry: Entry, ctx: RealizeContext) -> NoRepeatNgramProcessor:
    """A fresh processor for one ``no_repeat_ngram`` entry; with ``include_prompt``, the request's
    prompt (``ctx.prompt_ids``) is indexed once here, and a request whose engine gives no prompt fails."""
    prompt: Sequence[int] = ()
    if entry.include_prompt:
        if not ctx.prompt_ids:  # an engine that gives no prompt gives it empty
            raise ValueError("no_repeat_ngram with include_prompt needs the request's prompt, which this engine did not give")
        prompt = ctx.prompt_ids
    max_tokens = ctx.sampling.max_tokens
    positions = len(ctx.prompt_ids) + max_tokens if ctx.prompt_ids and max_tokens is not None else None
    return NoRepeatNgramProcessor(entry.size, ctx.vocab_size, prompt, positions=positions, outputs=max_tokens)
