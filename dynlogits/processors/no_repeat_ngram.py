"""``no_repeat_ngram``: every token that would complete an n-gram of ``size`` tokens the history
already holds is masked, exactly as transformers' ``NoRepeatNGramLogitsProcessor(size)`` on that
history (the output, or the prompt and the output with ``include_prompt``): the processor.

Resident where the adapter gives the rows' histories on the host (vLLM's V1 runner): a
``NoRepeatNgramTemplate`` whose group decides every member row on the host in one pass from its
processor's index and masks what they find with one upload and one ``index_fill_`` (no tensor per
row). Where the histories live on the device (vLLM's Model Runner V2), the same group decides every
row on the device from the engine's token matrix (``no_repeat_ngram_device``), no read back, for
sizes up to ``MAX_DEVICE_SIZE``; larger sizes are hosted there (per row, ``row_op``).

Per step and row: the row's index (each ``size - 1`` tokens of the history -> the tokens that
followed them) is found by comparing the history with the tokens it covers (a C-level list compare,
no Python loop: of its last ``TAIL_CHECKED`` tokens when the history is the same list as at the
row's last step, as vLLM's V1 runner passes it, else of all of them), extended by the tokens
generated since (``size`` work each) and read once for the history's last ``size - 1`` tokens
(the ids a key masks kept per row until the key gains a follower; the common step, the same list
one token longer, takes a path of its own that compares the same tokens). A history no kept index covers (the first
call, another sample, a rejected draft) is indexed from scratch once: ``O(len(history) * size)``.
The prompt's n-grams (``include_prompt``) are indexed once per request, at realization.

Placeholders: a negative id is a token not known yet (vLLM's ``-1`` in the newest slot under async
scheduling), never an id: an n-gram holding one is skipped, and a step whose last ``size - 1``
tokens hold one masks only what the n-grams without it say (for ``size > 1``: nothing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import torch

from dynlogits.specs.builtin.no_repeat_ngram import NoRepeatNgram, NoRepeatNgramSpec

from .base import IndexCache, RealizeContext
from .modes import Decider, WindowDecided
from .no_repeat_ngram_device import CHUNK, MAX_DEVICE_SIZE, NEVER, Constants, constants, device_bans
from .ops import MaskIds, RowOp, apply_op
from .slots import NEG_INF, GatheredRows, Group, ListedRows, StepInputs, Template
from .uploads import StepUpload
from .window import TokenWindow

__all__ = ["KEPT_ROWS", "KIND", "TAIL_CHECKED", "NoRepeatNgramGroup", "NoRepeatNgramProcessor", "NoRepeatNgramTemplate", "banned_after",
           "factory"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = NoRepeatNgramSpec | NoRepeatNgram

KIND = "no_repeat_ngram"

#: Row indexes one processor keeps (samples, beams, draft rows of its request), the least recently
#: used dropped first; a row whose index was dropped is indexed again from its history.
KEPT_ROWS = 16
#: Tokens before the covered end compared when a row's history is the list its index was last read
#: from (a list an engine grows): a rewrite deeper than this in the same list object goes unseen.
TAIL_CHECKED = 64
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


class _Row:
    """One history's index: ``tokens``, a copy of the history's tokens up to its first placeholder,
    ``index``, the n-grams ending in them (beyond the prompt's), and ``source``, the list it was last
    read from (an engine's live history: vLLM's V1 runner hands each row the same growing list).
    ``before``: ``tokens``' last ``size - 1`` tokens as a key (``None`` while they are fewer), the
    next token's n-gram prefix; ``ids``: per key looked up, the ids it masks (sorted, inside the
    logits width, the prompt's included), dropped when the key gains a follower."""

    __slots__ = ("tokens", "index", "source", "before", "ids")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.index: Index = {}
        self.source: list[int] | None = None
        self.before: tuple[int, ...] | None = None
        self.ids: dict[tuple[int, ...], tuple[int, ...]] = {}

    def add(self, before: tuple[int, ...], token: int) -> None:
        """The n-gram ``before + (token,)``, its key's kept ids dropped if it is new."""
        followers = self.index.get(before)
        if followers is None:
            self.index[before] = {token}
        elif token in followers:
            return
        else:
            followers.add(token)
        self.ids.pop(before, None)


class NoRepeatNgramProcessor:
    """Every step, each token that would complete an n-gram of ``size`` tokens already in
    ``prompt + history`` is masked (``prompt``: empty unless the entry includes it).

    Stateless for its callers: one instance serves every row of its request, in any order, each
    with its own history; what it keeps (an index per history, ``KEPT_ROWS`` at most) is a cache
    keyed by the history's tokens, checked against them at every call."""

    __slots__ = ("size", "vocab_size", "template", "_prompt", "_prompt_index", "_rows", "_sets")

    def __init__(self, size: int, vocab_size: int, prompt: Sequence[int] = (), *, positions: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size, self.vocab_size = size, vocab_size
        self._prompt = tuple(prompt)
        self._prompt_index = _index(self._prompt, size) if self._prompt else {}
        self._rows: list[_Row] = []  # most recently used first
        self._sets: dict[tuple[int, ...], IndexCache] = {}
        self.template = NoRepeatNgramTemplate(size, bool(self._prompt), positions)

    def _row_for(self, history: list[int]) -> _Row:
        """The kept index whose tokens begin ``history`` (made most recent), extended to its first
        placeholder; a fresh one when none does. A history is compared whole with an index's tokens,
        except the list the index was last read from: engines append to it (and put a placeholder's
        token in its place), so its last ``TAIL_CHECKED`` covered tokens are compared."""
        n = len(history)
        for i, row in enumerate(self._rows):
            k = len(row.tokens)
            if k > n:
                continue
            if history is row.source:
                j = max(0, k - TAIL_CHECKED)
                same = history[j:k] == row.tokens[j:]
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

    def _extend(self, row: _Row, history: list[int]) -> None:
        size, tokens, prompt = self.size, row.tokens, self._prompt
        for j in range(len(tokens), len(history)):
            token = history[j]
            if token < 0:
                return
            if size == 1:
                row.add((), token)
            elif j >= size - 1:
                row.add(tuple(tokens[j - size + 1:]), token)
            elif len(prompt) + j >= size - 1:  # an n-gram that begins in the prompt
                before = (*prompt[len(prompt) + j - size + 1:], *tokens)
                if min(before) >= 0:
                    row.add(before, token)
            tokens.append(token)

    def banned(self, history: Sequence[int]) -> tuple[int, ...]:
        """The ids this step masks (sorted, no repeats, inside the logits width)."""
        h = history if type(history) is list else list(history)
        rows = self._rows
        if rows:  # the common step: the list last read, one known token longer (what ``_row_for`` and ``_extend`` do, inlined)
            row = rows[0]
            tokens, before = row.tokens, row.before
            k = len(tokens)
            if h is row.source and before is not None and len(h) == k + 1:
                token = h[k]
                if token >= 0:
                    tokens.append(token)
                    if not (h == tokens if k < TAIL_CHECKED else h[k - TAIL_CHECKED:k] == tokens[k - TAIL_CHECKED:k]):
                        tokens.pop()
                        return self._banned(h)
                    row.add(before, token)
                    if before:
                        before = row.before = (*before[1:], token)
                    ids = row.ids.get(before)
                    return self._ids(row, before) if ids is None else ids
        return self._banned(h)

    def _banned(self, h: list[int]) -> tuple[int, ...]:
        row = self._row_for(h)
        size, n, known = self.size, len(h), len(row.tokens)
        if size == 1:
            row.before = ()
        elif known >= size - 1:
            row.before = tuple(row.tokens[known - size + 1:])
        else:
            row.before = None
        if known < n:  # a placeholder at ``known``
            if known < n - 1:
                return tuple(sorted(t for t in self._scan(h) if t < self.vocab_size))
            if size > 1:
                return ()
        before = row.before
        if before is None:
            if len(self._prompt) + known < size - 1:
                return ()
            before = (*self._prompt[len(self._prompt) + known - size + 1:], *row.tokens)
        ids = row.ids.get(before)
        return self._ids(row, before) if ids is None else ids

    def _ids(self, row: _Row, before: tuple[int, ...]) -> tuple[int, ...]:
        """The ids ``before`` masks in ``row`` (the prompt's n-grams included), kept in ``row.ids``."""
        found = row.index.get(before)
        early = self._prompt_index.get(before)
        if early:
            found = early | found if found else early
        ids = tuple(sorted(t for t in found if t < self.vocab_size)) if found else ()
        row.ids[before] = ids
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
    by its own processor (``NoRepeatNgramProcessor.banned``), in one pass; the ids found become flat
    indices, uploaded once, and masked with one ``index_fill_``; no device tables. From the token
    window (Model Runner V2): every row decided on the device (``no_repeat_ngram_device.device_bans``)
    from its slot's table (``params``: size, whether the prompt counts), for sizes up to
    ``MAX_DEVICE_SIZE`` (``fits_window``; larger ones hosted), masked with one ``scatter_reduce_``.
    Masks only: never leaves a row empty by itself."""

    @classmethod
    def fits_window(cls, template: Template, group: Group | None) -> bool:
        """Sizes up to ``MAX_DEVICE_SIZE``: each step compares ``rows * max_model_len * (size - 1)`` cells."""
        assert isinstance(template, NoRepeatNgramTemplate)
        return template.size <= MAX_DEVICE_SIZE

    def __init__(self, level: int, num_slots: int, device: torch.device) -> None:
        super().__init__(level, num_slots, device)
        self.params = self.table(torch.long, pad=0, width=2)
        self._sizes: dict[int, int] = {}  # member slot -> size, window groups
        self._positions: dict[int, int | None] = {}  # member slot -> its positions (None: unknown), window groups
        self._consts: dict[tuple[int, int], Constants] = {}  # kept across steps
        self._extremes: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _write(self, slot: int, template: NoRepeatNgramTemplate) -> None:
        if not self.from_window:
            return None  # decided on the host: everything it reads is the row's history and its processor's index
        self.params.set(slot, [template.size, int(template.include_prompt)])
        self._sizes[slot] = template.size
        self._positions[slot] = template.positions
        return None

    def assign(self, slot: int, template: Template | None) -> None:
        if template is None:
            self._sizes.pop(slot, None)
            self._positions.pop(slot, None)
        super().assign(slot, template)

    # -- token window (Model Runner V2) -------------------------------------------------------------
    def _rows_tables(self, rows: GatheredRows, window: TokenWindow,
                     size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The rows' slots within the engine's, each row's history start (``NEVER`` outside the
        group), ``CHUNK * (prompt_len - 1)`` and its unused columns (``None`` when every member's size is the group's), gathered once while ``rows.slot_of_row`` is the same tensor,
        the group's size the same and no table changes (a flush clears ``_cache``)."""
        cached = self._cache.get("window")
        sizes = set(self._sizes.values())
        if cached is not None and cached[0] is rows.slot_of_row and cached[1] == size and cached[2] == sizes:
            return cached[3]
        slots = window.slots(rows.slot_of_row)
        params = self.params.dev[rows.slot_of_row]
        prompt_len = window.prompt_len[slots].long()
        start = torch.where(rows.member, torch.where(params[:, 1] > 0, 0, prompt_len), NEVER)
        chunk = (prompt_len - 1) * CHUNK
        unused = None
        if len(sizes) > 1:
            columns = self._constants(window, size)[2]
            unused = columns[None, :] < (size - params[:, 0])[:, None]
        made = (slots, start, chunk, unused)
        self._cache["window"] = (rows.slot_of_row, size, sizes, made)
        return made

    def _constants(self, window: TokenWindow, size: int) -> Constants:
        """The window's constants: ``W`` the engine's matrix width, or less where every member's
        positions are known (a row past them is one whose sample the runner discards: it sees a
        part of its history, so masks a subset of its ids)."""
        width = window.tokens.shape[1]
        spans = self._positions.values()
        if spans and None not in spans:
            width = min(width, max(n for n in spans if n is not None))
        width = max(width, size)
        consts = self._consts.get((width, size))
        if consts is None:
            if len(self._consts) > 16:
                self._consts.clear()
            consts = self._consts[(width, size)] = constants(width, size, self.device)
        return consts

    def decide_from_window(self, rows: GatheredRows, window: TokenWindow) -> torch.Tensor:
        """Per row and window of its history (``[rows, W - S + 1]``): whether the token after it is
        banned now; the tokens are kept for ``apply_device_decisions``."""
        size = max(self._sizes.values(), default=1)
        slots, start, chunk, unused = self._rows_tables(rows, window, size)
        ids, hit = device_bans(window, slots, start, chunk, unused, size, self._constants(window, size))
        self._cache["ids"] = ids
        return hit

    def apply_device_decisions(self, step: StepInputs, rows: GatheredRows, hit: torch.Tensor) -> None:
        """``-inf`` at the tokens ``decide_from_window`` found."""
        ids = self._cache.pop("ids")
        key = (step.logits.dtype, step.logits.device)
        extremes = self._extremes.get(key)
        if extremes is None:
            extremes = self._extremes[key] = (torch.full((), NEG_INF, dtype=key[0], device=key[1]),
                                              torch.full((), -NEG_INF, dtype=key[0], device=key[1]))
        step.logits.scatter_reduce_(1, ids.clamp(0, step.logits.shape[1] - 1), torch.where(hit, *extremes), reduce="amin")
        return None

    def prepare(self, rows: ListedRows, stride: int) -> None:
        """Per layout: each member row's start in the flat logits (host)."""
        super().prepare(rows, stride)
        self._cache["base"] = (rows.rows * stride).tolist()

    def decide_rows(self, deciders: list[Decider], histories: Sequence[Sequence[int]],
                    fail: Callable[[int, int, Exception], None]) -> list[int]:
        """The flat indices the member rows mask this step; a row whose processor raises is passed
        to ``fail`` and masks nothing."""
        found: list[int] = []
        add = found.append
        for base, (row, slot, processor) in zip(self._cache["base"], deciders):
            try:
                ids = processor.banned(histories[row])
            except Exception as exc:  # a bug must not escape the sampler: this row alone
                fail(row, slot, exc)
                continue
            for t in ids:
                add(base + t)
        return found

    def apply_host_decisions(self, step: StepInputs, rows: ListedRows, found: list[int], upload: StepUpload) -> None:
        if found:
            upload.buffer(len(found))[:] = found
            step.flat.index_fill_(0, upload.upload(len(found)), NEG_INF)
        return None


@dataclass(frozen=True, slots=True)
class NoRepeatNgramTemplate(Template):
    """Every step: the ids that would complete an n-gram of ``size`` tokens the row's history holds
    (the prompt's too with ``include_prompt``), decided per row on the host from histories, else on
    the device from the token window."""

    size: int
    include_prompt: bool = False
    #: the most positions a row of the request reaches (prompt plus ``max_tokens``; ``None``: unknown):
    #: the window decided on the device is no wider than its members' largest
    positions: int | None = None
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
    return NoRepeatNgramProcessor(entry.size, ctx.vocab_size, prompt, positions=positions)
