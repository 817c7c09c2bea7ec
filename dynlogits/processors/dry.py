"""``dry``: llama.cpp's DRY repetition penalty ("Don't Repeat Yourself", koboldcpp's, by pi6am after
p-e-w's scheme): the processor, and its template (``dry_group``: resident where the adapter gives
the rows' histories on the host, vLLM's V1 runner; hosted elsewhere, per row).

The rule is llama.cpp's (``src/llama-sampling.cpp``: ``get_overlapping_token_sequences`` and
``llama_sampler_init_dry`` for the breakers, ``llama_sampler_dry_apply`` for a step), stated in
docs/specs.md (``dry``); ``dynlogits.testing.dry_reference`` restates llama.cpp's steps literally
(its Z-algorithm included), and the tests hold this module to it on random histories, grown step
by step. The processor keeps, per history (``KEPT_ROWS`` of them, checked against its tokens at
every call), the window's state: each token's positions, and for every earlier position of the
window's last token the length of the repeat ending there (capped where the penalty stops growing:
``allowed_length`` plus llama.cpp's exponent clamp). One more token ``t`` makes the repeats ending at
``t``'s earlier positions those ending one before them, one longer (never reaching past the
window's start), so a step that only grew the history costs O(occurrences of ``t`` in the window),
plus the nearest breaker (from the breaker heads' positions, the nearest first) and the ids those
repeats would extend; the amounts come from a table shared per (multiplier, base), ``multiplier *
base ** exponent`` computed as llama.cpp computes it. That common step (the live list, one token
longer) is one fused pass that emits each id as its repeat is measured. A history the state does
not cover (its first call, another row, a rewrite deeper than ``TAIL_CHECKED``, more than
``REBUILD_AFTER`` new tokens) rebuilds it once: every earlier position whose token equals the
window's last one is a candidate, and the candidates still matching are extended one token back at a time, all at once (numpy); past
``VECTOR_STEPS`` extensions (a 32nd of the window for longer windows) the Z-algorithm finishes them,
O(window). A history with a placeholder before its newest slot (no engine makes one) is scanned
that way whole, without state. The window is bounded by ``MAX_DRY_LOOKBACK`` before any work.

Breakers are resolved once per (vocabulary, breaker) and shared (``BREAKERS_KEPT``): a token whose
text holds the breaker breaks a repeat alone; a token whose text ends with a proper prefix of the
breaker breaks it when the tokens of the breaker's rest follow. The rest's tokens are found in the
vocabulary (longest match first, lowest id on a tie) where llama.cpp runs its tokenizer: the same
wherever the rest is spelled by whole tokens that way (always for one-character breakers, such as
the defaults, which have no rest)."""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch

from dynlogits.specs.builtin.dry import MAX_DRY_LOOKBACK, MAX_DRY_TAIL_TOKENS, Dry, DrySpec

from .base import RealizeContext
from .dry_group import DryTemplate
from .kept import Kept, deep_size

__all__ = ["BREAKERS_BYTES", "BREAKERS_KEPT", "KIND", "Breakers", "DryProcessor", "NativeParams", "breakers_of",
           "factory", "max_exponent"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = DrySpec | Dry

KIND = "dry"

#: Breakers whose tables are kept per vocabulary, least recently used dropped first.
BREAKERS_KEPT = 64
BREAKERS_BYTES = 16 << 20

#: llama.cpp's ``FLOAT_MAX_LOG``: the exponent clamp keeps ``base ** exponent`` within float32.
FLOAT_MAX_LOG = np.float32(88.7228391)


def max_exponent(base: float) -> int:
    """llama.cpp's exponent clamp for ``base`` (0: none), computed in float32 as it computes it."""
    b = np.float32(base)
    if b <= np.float32(1.000001):
        return 0
    return int(FLOAT_MAX_LOG / np.float32(math.log(float(b))))


@dataclass(frozen=True)
class Breakers:
    """Resolved sequence breakers: ``single`` ids break a repeat alone (and are never penalized), as a
    mask over ids and a set; ``tails[head]`` the token sequences (longest first) that, following
    ``head``, break one; ``heads`` a mask of every id that may begin a breaker. A mask is as long as
    the largest such id + 1 (ids past it are in none)."""

    single: np.ndarray
    single_set: frozenset[int]
    tails: dict[int, tuple[tuple[int, ...], ...]]
    heads: np.ndarray

    @staticmethod
    def none() -> Breakers:
        empty = np.zeros(0, dtype=bool)
        return Breakers(empty, frozenset(), {}, empty)

    @cached_property
    def sorted_singles(self) -> tuple[int, ...]:
        """``single_set`` ascending (the device's table of them)."""
        return tuple(sorted(self.single_set))


def _mask(ids: set[int] | frozenset[int]) -> np.ndarray:
    mask = np.zeros(max(ids) + 1 if ids else 0, dtype=bool)
    mask[list(ids)] = True
    return mask


def _in(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Which of ``ids`` the mask holds (negative ids and ids past it: none)."""
    inside = (ids >= 0) & (ids < len(mask))
    inside[inside] = mask[ids[inside]]
    return inside


class _Table(NamedTuple):
    """One breaker against one vocabulary: the ids whose text holds it, and the ids whose text ends
    with a proper prefix of it, each with the tails (the rest's tokens) that must follow."""

    single: frozenset[int]
    tails: dict[int, frozenset[tuple[int, ...]]]


def _spell(text: str, pieces: dict[str, int]) -> tuple[int, ...] | None:
    """``text`` as vocabulary tokens, longest piece first (``None``: a character no piece spells)."""
    out: list[int] = []
    i, longest = 0, max((len(p) for p in pieces), default=0)
    while i < len(text):
        for j in range(min(len(text), i + longest), i, -1):
            token = pieces.get(text[i:j])
            if token is not None:
                out.append(token)
                i = j
                break
        else:
            return None
    return tuple(out)


def _one_breaker(vocabulary: Sequence[str], breaker: str) -> _Table:
    """One breaker against the vocabulary, as llama.cpp's ``get_overlapping_token_sequences`` matches
    it: a token whose text holds the breaker breaks alone; otherwise each place where the token's text
    ends with a proper prefix of the breaker gives a tail, the rest of the breaker as tokens."""
    single: set[int] = set()
    tails: dict[int, set[tuple[int, ...]]] = {}
    rest_len = len(breaker) - 1
    overlaps: list[tuple[int, int]] = []  # (id, characters of the breaker its text ends with)
    first = breaker[0]
    for token, text in enumerate(vocabulary):
        if breaker in text:
            single.add(token)
        elif rest_len and first in text[-rest_len:]:
            end = text[-rest_len:]
            for pos in range(len(end)):
                if end[pos] == first and breaker.startswith(end[pos:]):
                    overlaps.append((token, len(end) - pos))
    if overlaps:
        wanted = {breaker[i:j] for i in range(1, len(breaker)) for j in range(i + 1, len(breaker) + 1)}
        pieces: dict[str, int] = {}
        for token, text in enumerate(vocabulary):
            if text in wanted and text not in pieces:
                pieces[text] = token
        for token, matched in overlaps:
            tail = _spell(breaker[matched:], pieces)
            if tail is not None:
                tails.setdefault(token, set()).add(tail[:MAX_DRY_TAIL_TOKENS])
    return _Table(frozenset(single), {token: frozenset(found) for token, found in tails.items()})


#: (id of the vocabulary, breaker) -> (the vocabulary, its table), and (id, breakers) -> (the
#: vocabulary, the resolved set): the vocabulary is held so that its id stays its own.
_TABLES: Kept[tuple[Sequence[str], _Table]] = Kept(BREAKERS_KEPT, BREAKERS_BYTES)
_RESOLVED: Kept[tuple[Sequence[str], Breakers]] = Kept(BREAKERS_KEPT, BREAKERS_BYTES)


def _weight(single: frozenset[int] | np.ndarray, tails: dict[int, Any]) -> int:
    """About the bytes a table holds beyond the vocabulary: its ids and tails."""
    return 64 * len(single) + deep_size(tails) + 256


def _breaker_table(vocabulary: Sequence[str], breaker: str) -> _Table:
    key = (id(vocabulary), breaker)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is vocabulary:
        return hit[1]
    table = _one_breaker(vocabulary, breaker)
    _TABLES.put(key, (vocabulary, table), _weight(table.single, table.tails))
    return table


def breakers_of(vocabulary: Sequence[str] | None, breakers: Sequence[str]) -> Breakers:
    """The breakers resolved against ``vocabulary`` (each token id's text), kept per vocabulary and
    breaker set. ``ValueError`` when there are breakers but no vocabulary (no tokenizer)."""
    if not breakers:
        return Breakers.none()
    if vocabulary is None:
        raise ValueError("sequence_breakers are matched against the tokenizer's vocabulary, which this engine "
                         "does not give (send sequence_breakers: [] to run without breakers)")
    names = tuple(dict.fromkeys(breakers))
    key = (id(vocabulary), names)
    hit = _RESOLVED.get(key)
    if hit is not None and hit[0] is vocabulary:
        return hit[1]
    single: set[int] = set()
    tails: dict[int, set[tuple[int, ...]]] = {}
    for breaker in names:
        table = _breaker_table(vocabulary, breaker)
        single |= table.single
        for token, found in table.tails.items():
            tails.setdefault(token, set()).update(found)
    # the longest tail first: llama.cpp keeps the longest that matches
    ordered = {t: tuple(sorted(found, key=len, reverse=True)) for t, found in tails.items()}
    resolved = Breakers(_mask(single), frozenset(single), ordered, _mask(single | set(tails)))
    _RESOLVED.put(key, (vocabulary, resolved), _weight(resolved.single_set, ordered) + 2 * len(resolved.heads))
    return resolved


#: Extensions done for all candidates at once (at least; a 32nd of the window for longer windows)
#: before the Z-algorithm takes over: each costs a few array operations, the Z-algorithm O(window).
VECTOR_STEPS = 8
#: Row states one processor keeps (samples, beams, draft rows of its request), the least recently
#: used dropped first; a row whose state was dropped is rebuilt from its window.
KEPT_ROWS = 16
#: Tokens before the covered end compared when a row's history is the list its state was last read
#: from (a list an engine grows, rewriting at most its newest tokens): a rewrite deeper than this in
#: the same list object goes unseen.
TAIL_CHECKED = 16
#: Histories shorter than this that are the list a state was last read from are compared whole on
#: the common step (with the row's ``hist``: a C-level compare of pointers, no token object read),
#: longer ones on their last ``TAIL_CHECKED`` tokens (slices, which touch each token object).
WHOLE_COMPARED = 256
#: New tokens past which a row's state is rebuilt from its window (array operations, O(window))
#: rather than extended token by token.
REBUILD_AFTER = 48


def _z_array(seq: list[int]) -> list[int]:
    """``z[s]``: how many tokens ``seq[s:]`` shares with ``seq`` from the start (``z[0]``: its length)."""
    n = len(seq)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0
    for s in range(1, n):
        k = min(right - s, z[s - left]) if s < right else 0
        while s + k < n and seq[k] == seq[s + k]:
            k += 1
        z[s] = k
        if s + k > right:
            left, right = s, s + k
    return z


def _match_lengths(w: np.ndarray, cap: int) -> np.ndarray:
    """``lengths[p]`` for every position ``p`` of the window ``w`` but its last: how many tokens the
    stretch ending at ``p`` and the window's end share, read backwards, at most ``cap``. Positions
    whose token equals the last one are extended one token back together, then by the Z-algorithm."""
    n = len(w)
    end = n - 1
    lengths = np.zeros(max(n - 1, 0), dtype=np.int64)
    if n < 2 or cap < 1:
        return lengths
    live = np.flatnonzero(w[:-1] == w[end])
    k, switch = 1, max(VECTOR_STEPS, n // 32)
    while len(live) and k < cap:
        if k == switch:  # long repeats (a loop): the rest by the Z-algorithm, O(window)
            z = _z_array(w[::-1].tolist())
            lengths[live] = np.minimum(np.array([z[end - p] for p in live.tolist()], dtype=np.int64), cap)
            return lengths
        reach = live >= k
        lengths[live[~reach]] = k
        live = live[reach]
        same = w[live - k] == w[end - k]
        lengths[live[~same]] = k
        live = live[same]
        k += 1
    if len(live):
        lengths[live] = min(k, cap)
    return lengths


#: Amount tables kept, one per (multiplier, base): shared by every processor of those settings, so a
#: step's amounts are read from a few objects whatever the batch.
AMOUNT_TABLES_KEPT = 64
_AMOUNT_TABLES: dict[tuple[float, float], list[float]] = {}


def _amounts_table(multiplier: float, base: float) -> list[float]:
    """The shared table of ``multiplier * base ** exponent`` (exponent -> amount, as llama.cpp
    computes it), grown on demand by ``_grow``; tables past ``AMOUNT_TABLES_KEPT`` are dropped
    (processors holding one keep it)."""
    key = (multiplier, base)
    table = _AMOUNT_TABLES.get(key)
    if table is None:
        if len(_AMOUNT_TABLES) >= AMOUNT_TABLES_KEPT:
            _AMOUNT_TABLES.clear()
        table = _AMOUNT_TABLES[key] = []
    return table


#: held while a shared table grows: processors of two threads never append the same exponent twice
_GROWING = threading.Lock()


def _grow(table: list[float], exponent: int, multiplier: float, base: float) -> None:
    """``table`` up to ``exponent`` included (entries are only appended, each once: readers index
    the entries already there without the lock)."""
    with _GROWING:
        while len(table) <= exponent:
            table.append(multiplier * base ** len(table))


class _Row:
    """One history's state: ``seq``, the prompt's tail (``p0`` tokens) then a copy of the history's
    tokens up to its first placeholder (``len(seq) - p0`` of them), ``hist`` a list of those tokens alone
    (the history's mirror, compared with it whole); for the window ending there, ``occ`` (token -> its
    positions in the window, ascending), ``cur`` (position -> the length of the repeat ending there,
    at most the processor's cap, for every earlier position whose token is the last one: the others
    are 0) and ``heads`` (the positions of tokens that may begin a breaker); ``source``, the list it
    was last read from (vLLM's V1 runner hands each row the same growing list)."""

    __slots__ = ("seq", "hist", "occ", "cur", "heads", "source")

    def __init__(self, prompt: list[int]) -> None:
        self.seq = list(prompt)
        self.hist: list[int] = []
        self.occ: dict[int, list[int]] = {}
        self.cur: dict[int, int] = {}
        self.heads: list[int] = []
        self.source: Sequence[int] | None = None


#: What a common step reads of its processor's settings, one tuple shared by every processor of
#: equal settings (``_hot_settings``): read from a few objects whatever the batch.
_Hot = tuple[int, int, int, int, list[float], frozenset[int], bool]
_HOT: dict[tuple[Any, ...], _Hot] = {}
HOT_KEPT = 256


class NativeParams(NamedTuple):
    """``DryProcessor.native_params``: one processor's settings as ``dry_native`` steps them."""

    lookback: int
    cap: int
    allowed: int
    cap_exp: int
    amounts: np.ndarray
    singles: np.ndarray


def _hot_settings(lookback: int, cap: int, allowed: int, cap_exp: int, amounts: list[float],
                  head_ids: frozenset[int]) -> _Hot:
    """The shared tuple ``(lookback, cap, allowed, cap_exp, amounts, head_ids, no_heads)`` of these
    settings (``amounts``: the shared table; past ``HOT_KEPT`` the kept tuples are dropped, the
    processors holding one keep it)."""
    hot = (lookback, cap, allowed, cap_exp, amounts, head_ids, not head_ids)
    key = (lookback, cap, allowed, cap_exp, id(amounts), head_ids)
    kept = _HOT.get(key)
    if kept is not None and kept[4] is amounts:
        return kept
    if len(_HOT) >= HOT_KEPT:
        _HOT.clear()
    _HOT[key] = hot
    return hot


class DryProcessor:
    """Every step: the tokens that would extend a repeat of at least ``allowed_length`` tokens within
    the window (the last ``lookback`` tokens of the prompt tail and the history) lose
    ``multiplier * base ** (length - allowed_length)`` (the exponent clamped as llama.cpp clamps it).
    Negative ids in a history (placeholders) match nothing and are never penalized.

    Stateless for its callers: one instance serves any number of rows and histories, in any order;
    what it keeps (a state per history, ``KEPT_ROWS`` at most) is a cache keyed by the history's
    tokens, checked against them at every call. A history that only grew since its state was made
    costs O(occurrences of its new token in the window) per new token, plus the nearest breaker and
    the repeats the last token extends; any other history rebuilds its state once, O(window)."""

    #: the attributes a common step reads first (``_hot``: its settings, shared), then the rest
    __slots__ = ("_top", "_hot", "_p0", "_off", "_rows", "_lookback", "_cap", "_allowed", "_amounts", "_cap_exp",
                 "_single", "_head_ids", "_breakers", "_base", "_multiplier", "_prompt", "_prompt_list", "template",
                 "_native", "native_row")

    def __init__(self, *, multiplier: float, base: float, allowed_length: int, lookback: int,
                 breakers: Breakers, prompt: Sequence[int] = (), include_prompt: bool = True) -> None:
        self._multiplier, self._base, self._allowed = float(multiplier), float(base), int(allowed_length)
        self._lookback, self._breakers = int(lookback), breakers
        self._cap_exp = max_exponent(base)
        #: the longest repeat worth measuring: past ``allowed + cap_exp`` the penalty no longer grows
        #: (and past the look-back no repeat reaches)
        self._cap = max(min(self._allowed + self._cap_exp, self._lookback) if self._cap_exp > 0 else self._lookback, 1)
        self._head_ids = frozenset(breakers.single_set | set(breakers.tails))
        self._single = breakers.single_set
        self._off = self._multiplier == 0.0 or self._lookback == 0
        tail = list(prompt[-lookback:]) if lookback > 0 else []
        self._prompt = np.array(tail, dtype=np.int64)
        self._prompt_list = [int(t) for t in tail]
        self._p0 = len(tail)
        self._amounts = _amounts_table(self._multiplier, self._base)
        self._rows: list[_Row] = []  # most recently used first
        self._top: _Row | None = None  # ``_rows[0]``
        self._hot = _hot_settings(self._lookback, self._cap, self._allowed, self._cap_exp, self._amounts,
                                  self._head_ids)
        self.template = DryTemplate(self._multiplier, self._base, self._allowed, self._lookback, include_prompt,
                                    self._cap, breakers.sorted_singles, bool(breakers.tails))
        self._native: NativeParams | None = None
        #: the row's state on the native step (``dry_native.NativeStep``; ``None``: none yet)
        self.native_row: Any = None

    def native_params(self) -> NativeParams | None:
        """What ``dry_native``'s step needs of this processor (``None``: it cannot step it: multi-token
        breakers, or off): look-back, cap, allowed length, exponent clamp, the amounts by exponent (as
        ``_grow`` computes them) and the single-token breakers' mask (``uint8``, empty: none)."""
        if self._off or self._breakers.tails or self._lookback < 1:
            return None
        if self._native is None:
            top = self._cap - self._allowed
            if self._cap_exp and top > self._cap_exp:
                top = self._cap_exp
            table = self._amounts
            if max(top, 0) >= len(table):
                _grow(table, max(top, 0), self._multiplier, self._base)
            self._native = NativeParams(self._lookback, self._cap, self._allowed, self._cap_exp,
                                        np.array(table[:max(top, 0) + 1], dtype=np.float64),
                                        self._breakers.single.astype(np.uint8))
        return self._native

    def native_window(self, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int]:
        """``dry_native``'s buffers for the window after ``history`` (no placeholder): the prompt's
        tail then ``history`` (``int32``), the repeat length ending at each earlier position of the
        last token (``uint16``, 0 elsewhere), both with room for as many tokens again (at least 64),
        and how many tokens they hold."""
        tokens = self._prompt_list + list(history)
        n = len(tokens)
        capacity = 64
        while capacity < 2 * (n + 1):
            capacity *= 2
        tok = np.zeros(capacity, dtype=np.int32)
        tok[:n] = tokens
        lens = np.zeros(capacity, dtype=np.uint16)
        if n >= 2:
            start = n - self._lookback if n > self._lookback else 0
            lens[start:n - 1] = _match_lengths(tok[start:n].astype(np.int64), self._cap)
        return tok, lens, n

    # -- the stateless scan (a placeholder inside a history) ------------------------------------
    def _window(self, input_ids: Sequence[int]) -> np.ndarray:
        n = self._lookback
        out = np.fromiter(input_ids[-n:], dtype=np.int64)
        if len(out) < n and len(self._prompt):
            out = np.concatenate((self._prompt[len(self._prompt) - min(len(self._prompt), n - len(out)):], out))
        negative = out < 0
        if negative.any():  # placeholders: each a value of its own, equal to no token and to no other placeholder
            out[negative] = -1 - np.flatnonzero(negative)
        return out

    def _rep_limit(self, w: np.ndarray) -> int:
        """The most tokens a repeat may reach back (llama.cpp's ``rep_limit``): up to the nearest
        breaker, its tail included."""
        b, n = self._breakers, len(w)
        if not len(b.heads):
            return n
        for q in np.flatnonzero(_in(w, b.heads))[::-1]:
            q = int(q)
            i = n - 1 - q
            head = int(w[q])
            longest = -1
            for tail in b.tails.get(head, ()):  # the longest first: the first that matches
                if len(tail) <= i and all(int(w[q + 1 + o]) == t for o, t in enumerate(tail)):
                    longest = len(tail)
                    break
            if longest < 0 and head in b.single_set:
                longest = 0
            if longest >= 0:
                return i - longest
        return n

    def _scan(self, input_ids: Sequence[int]) -> dict[int, int]:
        """Token -> the longest repeat it would extend (at least ``allowed_length``), from the whole
        window (no state)."""
        w = self._window(input_ids)
        n = len(w)
        if n <= self._allowed:
            return {}
        limit = self._rep_limit(w)
        if limit < self._allowed:
            return {}
        lengths = _match_lengths(w, min(limit, self._cap))
        ends = np.flatnonzero(lengths >= self._allowed)
        found: dict[int, int] = {}
        for token, length in zip(w[ends + 1].tolist(), lengths[ends].tolist()):
            if found.get(token, 0) < length:
                found[token] = length
        return found

    # -- the kept states -------------------------------------------------------------------------
    def _row_for(self, history: Sequence[int]) -> _Row:
        """The kept state whose tokens begin ``history`` (made most recent), extended to the
        history's first placeholder; a fresh one when none does. The list a state was last read from
        is compared on its last ``TAIL_CHECKED`` covered tokens (engines append to it and put a
        placeholder's token in its place), any other history whole."""
        n, p0 = len(history), self._p0
        fresh = False
        for i, row in enumerate(self._rows):
            k = len(row.seq) - p0
            if k > n:
                continue
            if history is row.source:
                j = k - TAIL_CHECKED if k > TAIL_CHECKED else 0
                same = list(history[j:k]) == row.seq[p0 + j:]
            else:
                same = list(history[:k]) == row.seq[p0:]
            if same:
                if i:
                    self._rows.insert(0, self._rows.pop(i))
                break
        else:
            row, fresh = _Row(self._prompt_list), True
            self._rows.insert(0, row)
            del self._rows[KEPT_ROWS:]
        self._top = row
        row.source = history
        k = len(row.seq) - p0
        if k < n or fresh:
            new = list(history[k:])
            if new and min(new) < 0:  # up to the first placeholder
                new = new[:next(j for j, t in enumerate(new) if t < 0)]
            if fresh or len(new) > REBUILD_AFTER:
                row.seq += new
                row.hist += new
                self._rebuild(row)
            else:
                for token in new:
                    self._extend(row, token)
        return row

    def _rebuild(self, row: _Row) -> None:
        """``row``'s window state from its tokens: O(window) (array operations for the repeats)."""
        seq, heads_of = row.seq, self._head_ids
        size = len(seq)
        start = size - self._lookback if size > self._lookback else 0
        occ: dict[int, list[int]] = {}
        heads: list[int] = []
        for pos in range(start, size):
            token = seq[pos]
            if token >= 0:
                found = occ.get(token)
                if found is None:
                    occ[token] = [pos]
                else:
                    found.append(pos)
                if token in heads_of:
                    heads.append(pos)
        if size > start and seq[-1] >= 0:
            occ[seq[-1]].pop()  # the last position is the end, not a candidate
            w = np.array(seq[start:], dtype=np.int64)
            negative = w < 0
            if negative.any():
                w[negative] = -1 - np.flatnonzero(negative)
            lengths = _match_lengths(w, self._cap)
            at = np.flatnonzero(lengths)
            row.cur = dict(zip((at + start).tolist(), lengths[at].tolist()))
            occ[seq[-1]].append(size - 1)
        else:
            row.cur = {}
        row.occ, row.heads = occ, heads

    def _extend(self, row: _Row, token: int) -> None:
        """``row``'s state after one more token (never a placeholder): the repeats ending at each
        earlier position of ``token`` are those ending one before it, one longer (capped, and never
        reaching past the window's start)."""
        seq = row.seq
        end = len(seq)
        start = end + 1 - self._lookback if end + 1 > self._lookback else 0
        occ = row.occ
        found = occ.get(token)
        cur: dict[int, int] = {}
        if found is None:
            occ[token] = [end]
        else:
            if found[0] < start:
                del found[:bisect_left(found, start)]
            before, cap = row.cur.get, self._cap
            for p in found:
                length = before(p - 1, 0) + 1
                if length > cap:
                    length = cap
                if length > p - start + 1:
                    length = p - start + 1
                cur[p] = length
            found.append(end)
        row.cur = cur
        if token in self._head_ids:
            row.heads.append(end)
        seq.append(token)
        row.hist.append(token)

    def _limit(self, row: _Row, start: int) -> int:
        """llama.cpp's ``rep_limit`` for ``row``'s window (from ``start``), from its breaker heads."""
        seq, b = row.seq, self._breakers
        size = len(seq)
        heads = row.heads
        if heads and heads[0] < start:
            del heads[:bisect_left(heads, start)]
        for q in reversed(heads):
            i = size - 1 - q
            head = seq[q]
            longest = -1
            for tail in b.tails.get(head, ()):  # the longest first: the first that matches
                if len(tail) <= i and tuple(seq[q + 1:q + 1 + len(tail)]) == tail:
                    longest = len(tail)
                    break
            if longest < 0 and head in b.single_set:
                longest = 0
            if longest >= 0:
                return i - longest
        return size - start

    def _found(self, history: Sequence[int]) -> dict[int, int]:
        """Token -> the longest repeat it would extend (at least ``allowed_length``) after ``history``."""
        n, p0 = len(history), self._p0
        rows = self._rows
        row = rows[0] if rows else None
        if row is not None and history is row.source and n == len(row.seq) - p0 + 1 and history[-1] >= 0:
            # the common step: the live list it last read, one token longer (its tail unchanged)
            k = n - 1
            j = k - TAIL_CHECKED if k > TAIL_CHECKED else 0
            if history[j:k] == row.seq[p0 + j:]:
                self._extend(row, history[k])
            else:
                row = self._row_for(history)
        else:
            row = self._row_for(history)
        known = len(row.seq) - p0
        if known < n:  # a placeholder at ``known``
            return self._scan(history) if known < n - 1 else {}
        seq = row.seq
        size = len(seq)
        start = size - self._lookback if size > self._lookback else 0
        allowed = self._allowed
        if size - start <= allowed or not row.cur:
            return {}
        limit = self._limit(row, start) if row.heads else size - start
        if limit < allowed:
            return {}
        found: dict[int, int] = {}
        for p, length in row.cur.items():
            if length > limit:
                length = limit
            if length >= allowed:
                token = seq[p + 1]
                if found.get(token, 0) < length:
                    found[token] = length
        return found

    # -- the step --------------------------------------------------------------------------------
    def penalize_into(self, input_ids: Sequence[int], width: int, base: int, flat: list[int],
                      amounts: list[float]) -> None:
        """Append ``base + id`` to ``flat`` for each id this step penalizes (inside ``width``, in no
        particular order) and its penalty to ``amounts`` (float64, as llama.cpp computes it).

        The common step (the live list last read, one token longer, no breaker head in the window,
        its covered tokens unchanged: compared whole with the row's ``hist`` below
        ``WHOLE_COMPARED`` tokens, else its last ``TAIL_CHECKED``) is read inline: ``_extend`` and
        ``_found`` fused, the ids each emitted as its repeat is measured (the same ids, amounts and
        order as the general path)."""
        row = self._top
        if row is not None:
            hist = row.hist
            k = len(hist)
            if input_ids is row.source and len(input_ids) == k + 1:
                token = input_ids[k]
                hot = self._hot
                if token >= 0 and (hot[6] or (not row.heads and token not in hot[5])):
                    hist.append(token)
                    if (input_ids == hist if k < WHOLE_COMPARED
                            else input_ids[k - TAIL_CHECKED:k] == hist[k - TAIL_CHECKED:k]):
                        self._step_into(row, token, width, base, flat, amounts, hot)
                        return
                    hist.pop()
        elif self._off:
            return
        found = self._found(input_ids)
        if found:
            for token, length in found.items():
                self._emit(token, length, width, base, flat, amounts)

    def _emit(self, token: int, length: int, width: int, base: int, flat: list[int], amounts: list[float]) -> None:
        """``base + token`` and its penalty for a repeat of ``length``, unless ``token`` is outside
        ``width`` or a breaker."""
        if token < 0 or token >= width or token in self._single:
            return
        exponent = length - self._allowed
        cap_exp = self._cap_exp
        if cap_exp and exponent > cap_exp:
            exponent = cap_exp
        table = self._amounts
        if exponent >= len(table):
            _grow(table, exponent, self._multiplier, self._base)
        flat.append(base + token)
        amounts.append(table[exponent])

    def _step_into(self, row: _Row, token: int, width: int, base: int, flat: list[int], amounts: list[float],
                   hot: _Hot) -> None:
        """The common step: ``_extend(row, token)`` and ``_found``'s ids for a window with no breaker
        head (its limit is the whole window, never below a repeat's length), emitted as found: each
        follower once, at its longest repeat, in the order its first repeat ends (``hot``: the
        processor's ``_hot``)."""
        seq = row.seq
        end = len(seq)
        seq.append(token)
        occ = row.occ
        found = occ.get(token)
        if found is None:
            occ[token] = [end]
            row.cur = {}
            return
        lookback, cap, allowed = hot[0], hot[1], hot[2]
        start = end + 1 - lookback if end + 1 > lookback else 0
        if start and found[0] < start:
            del found[:bisect_left(found, start)]
        before = row.cur.get
        cur: dict[int, int] = {}
        best = -1  # the one follower found so far (``-1``: none yet), else ``more`` holds them all
        best_length = 0
        more: dict[int, int] | None = None
        for p in found:
            length = before(p - 1, 0) + 1
            if length > cap:
                length = cap
            if length > p - start + 1:
                length = p - start + 1
            cur[p] = length
            if length >= allowed:
                follower = seq[p + 1]
                if more is None:
                    if best < 0 or follower == best:
                        if length > best_length or best < 0:
                            best, best_length = follower, length
                        continue
                    more = {best: best_length}
                if more.get(follower, 0) < length:
                    more[follower] = length
        found.append(end)
        row.cur = cur
        if more is not None:
            for follower, length in more.items():
                self._emit(follower, length, width, base, flat, amounts)
        elif 0 <= best < width:  # ``_emit`` inline: no breaker in the window, so the follower is none
            exponent = best_length - allowed
            cap_exp = hot[3]
            if cap_exp and exponent > cap_exp:
                exponent = cap_exp
            table = hot[4]
            if exponent >= len(table):
                _grow(table, exponent, self._multiplier, self._base)
            flat.append(base + best)
            amounts.append(table[exponent])

    def step_penalties(self, input_ids: Sequence[int], width: int) -> tuple[list[int], list[float]]:
        """The ids this step penalizes (inside ``width``, in no particular order) and each one's
        penalty (float64, as llama.cpp computes it)."""
        ids: list[int] = []
        pens: list[float] = []
        self.penalize_into(input_ids, width, 0, ids, pens)
        return ids, pens

    def penalties(self, input_ids: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids this step penalizes (inside ``width``, ascending) and each one's penalty (float64)."""
        ids, pens = self.step_penalties(input_ids, width)
        order = np.argsort(np.array(ids, dtype=np.int64), kind="stable")
        return np.array(ids, dtype=np.int64)[order], np.array(pens, dtype=np.float64)[order]

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        ids, pens = self.step_penalties(input_ids, logits.shape[-1])
        if not ids:
            return
        info = torch.finfo(logits.dtype)
        index = torch.tensor(ids, dtype=torch.int64).to(logits.device)
        values = logits[index]
        penalty = torch.from_numpy(np.minimum(np.array(pens, dtype=np.float64), info.max)).to(
            device=logits.device, dtype=logits.dtype)
        lowered = (values - penalty).clamp_min(info.min)  # a finite logit stays finite
        logits[index] = torch.where(torch.isfinite(values), lowered, values)


def _lookback(penalty_last_n: int) -> int:
    """llama.cpp's look-back: ``-1`` the whole context (here the most allowed), ``0`` off."""
    return MAX_DRY_LOOKBACK if penalty_last_n == -1 else penalty_last_n


def factory(entry: Entry, ctx: RealizeContext) -> DryProcessor:
    """A fresh processor for one ``dry`` entry. The breakers are resolved against ``ctx.vocabulary``
    (shared per vocabulary and breaker); ``ValueError`` when it names breakers and the engine gives
    no vocabulary. The prompt's tail counts with ``include_prompt`` and ``scope`` ``always`` (a scoped
    entry's history is its phase's stretch)."""
    off = entry.multiplier == 0.0 or entry.penalty_last_n == 0 or not entry.sequence_breakers
    breakers = Breakers.none() if off else breakers_of(ctx.vocabulary, entry.sequence_breakers)
    prompt = ctx.prompt_ids if entry.include_prompt and entry.scope == "always" else ()
    return DryProcessor(multiplier=entry.multiplier, base=entry.base, allowed_length=entry.allowed_length,
                        lookback=_lookback(entry.penalty_last_n), breakers=breakers, prompt=prompt,
                        include_prompt=entry.include_prompt and entry.scope == "always")

