"""``dry``: llama.cpp's DRY repetition penalty ("Don't Repeat Yourself", koboldcpp's, by pi6am after
p-e-w's scheme), as a hosted (per-row) processor.

The rule is llama.cpp's (``src/llama-sampling.cpp``: ``get_overlapping_token_sequences`` and
``llama_sampler_init_dry`` for the breakers, ``llama_sampler_dry_apply`` for a step), stated in
docs/specs.md (``dry``); ``dynlogits.testing.dry_reference`` restates llama.cpp's steps literally
(its Z-algorithm included), and the tests hold this module to it on random histories. This module
computes the same match lengths another way: every earlier position whose token equals the window's
last one is a candidate, and the candidates still matching are extended one token back at a time,
all at once (numpy), until none is left or the length reaches the most that can change the penalty
(the breaker limit, or ``allowed_length`` plus llama.cpp's exponent clamp); past ``VECTOR_STEPS``
extensions (a 32nd of the window for longer windows) the Z-algorithm finishes them. Per step and
row: O(window) to find the candidates and the nearest breaker, O(live candidates) per extension,
O(window) for the Z-algorithm; the window is bounded by ``MAX_DRY_LOOKBACK`` before any work.

Breakers are resolved once per (vocabulary, breaker) and shared (``BREAKERS_KEPT``): a token whose
text holds the breaker breaks a repeat alone; a token whose text ends with a proper prefix of the
breaker breaks it when the tokens of the breaker's rest follow. The rest's tokens are found in the
vocabulary (longest match first, lowest id on a tie) where llama.cpp runs its tokenizer: the same
wherever the rest is spelled by whole tokens that way (always for one-character breakers, such as
the defaults, which have no rest)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch

from dynlogits.specs.builtin.dry import MAX_DRY_LOOKBACK, MAX_DRY_TAIL_TOKENS, Dry, DrySpec

from .base import RealizeContext
from .kept import Kept, deep_size

__all__ = ["BREAKERS_BYTES", "BREAKERS_KEPT", "KIND", "Breakers", "DryProcessor", "breakers_of", "factory",
           "max_exponent"]

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


class DryProcessor:
    """Every step: the tokens that would extend a repeat of at least ``allowed_length`` tokens within
    the window (the last ``lookback`` tokens of the prompt tail and the history) lose
    ``multiplier * base ** (length - allowed_length)`` (the exponent clamped as llama.cpp clamps it).
    Stateless between calls: one instance serves any number of rows and histories. Negative ids in a
    history (placeholders) match nothing and are never penalized."""

    __slots__ = ("_allowed", "_base", "_breakers", "_cap_exp", "_lookback", "_multiplier", "_prompt")

    def __init__(self, *, multiplier: float, base: float, allowed_length: int, lookback: int,
                 breakers: Breakers, prompt: Sequence[int] = ()) -> None:
        self._multiplier, self._base, self._allowed = float(multiplier), float(base), int(allowed_length)
        self._lookback, self._breakers = int(lookback), breakers
        self._cap_exp = max_exponent(base)
        tail = list(prompt[-lookback:]) if lookback > 0 else []
        self._prompt = np.array(tail, dtype=np.int64)

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

    def penalties(self, input_ids: Sequence[int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids this step penalizes (inside ``width``) and each one's penalty (float64)."""
        none = (np.zeros(0, dtype=np.int64), np.zeros(0))
        if self._multiplier == 0.0 or self._lookback == 0:
            return none
        w = self._window(input_ids)
        n = len(w)
        if n <= self._allowed:
            return none
        limit = self._rep_limit(w)
        if limit < self._allowed:
            return none
        cap = limit if self._cap_exp == 0 else min(limit, self._allowed + self._cap_exp)
        end = n - 1
        lengths = np.zeros(n - 1, dtype=np.int64)  # lengths[p]: the repeat ending at p (as the window's end)
        live = np.flatnonzero(w[:-1] == w[end])
        k, switch = 1, max(VECTOR_STEPS, n // 32)
        while len(live) and k < cap:
            if k == switch:  # long repeats (a loop): the rest by the Z-algorithm, O(window)
                z = _z_array(w[::-1].tolist())
                lengths[live] = np.minimum(np.array([z[end - p] for p in live.tolist()], dtype=np.int64), cap)
                live = live[:0]
                break
            reach = live >= k
            lengths[live[~reach]] = k
            live = live[reach]
            same = w[live - k] == w[end - k]
            lengths[live[~same]] = k
            live = live[same]
            k += 1
        if len(live):
            lengths[live] = min(k, cap)
        ends = np.flatnonzero(lengths >= self._allowed)
        if not len(ends):
            return none
        tokens, found = w[ends + 1], lengths[ends]
        inside = (tokens >= 0) & (tokens < width)
        tokens, found = tokens[inside], found[inside]
        if len(self._breakers.single):
            keep = ~_in(tokens, self._breakers.single)
            tokens, found = tokens[keep], found[keep]
        if not len(tokens):
            return none
        ids, where = np.unique(tokens, return_inverse=True)
        longest = np.zeros(len(ids), dtype=np.int64)
        np.maximum.at(longest, where, found)
        exponents = longest - self._allowed
        if self._cap_exp > 0:
            exponents = np.minimum(exponents, self._cap_exp)
        return ids, self._multiplier * np.power(self._base, exponents.astype(np.float64))

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        ids, pens = self.penalties(input_ids, logits.shape[-1])
        if not len(ids):
            return
        info = torch.finfo(logits.dtype)
        index = torch.from_numpy(ids).to(logits.device)
        values = logits[index]
        penalty = torch.from_numpy(np.minimum(pens, info.max)).to(device=logits.device, dtype=logits.dtype)
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
    off = entry.multiplier == 0.0 or entry.penalty_last_n == 0
    breakers = Breakers.none() if off else breakers_of(ctx.vocabulary, entry.sequence_breakers)
    prompt = ctx.prompt_ids if entry.include_prompt and entry.scope == "always" else ()
    return DryProcessor(multiplier=entry.multiplier, base=entry.base, allowed_length=entry.allowed_length,
                        lookback=_lookback(entry.penalty_last_n), breakers=breakers, prompt=prompt)

