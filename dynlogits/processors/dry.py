"""``dry``: llama.cpp's DRY repetition penalty ("Don't Repeat Yourself", koboldcpp's, by pi6am after
p-e-w's scheme), as a hosted (per-row) processor.

The rule is llama.cpp's (``src/llama-sampling.cpp``: ``get_overlapping_token_sequences`` and
``llama_sampler_init_dry`` for the breakers, ``llama_sampler_dry_apply`` for a step), stated in
docs/specs.md (``dry``); ``dynlogits.testing.oracle`` restates llama.cpp's Z-algorithm literally,
and the tests hold this module to it on random histories. This module computes the same match
lengths another way: every earlier position whose token equals the window's last one is a candidate,
and the candidates still matching are extended one token back at a time, all at once (numpy), until
none is left or the length reaches the most that can change the penalty (the breaker limit, or
``allowed_length`` plus llama.cpp's exponent clamp). Per step and row: O(look-back) to find the
candidates and the nearest breaker, then O(live candidates) per extension; at most look-back x
look-back, bounded by ``MAX_DRY_LOOKBACK`` before any work.

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
from typing import TypeAlias

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
    """Resolved sequence breakers: ``single`` ids break a repeat alone (and are never penalized);
    ``tails[head]`` the token sequences that must follow ``head`` for it to break one (``()``: none,
    the head alone); ``heads`` every head id, sorted."""

    single: np.ndarray
    tails: dict[int, tuple[tuple[int, ...], ...]]
    heads: np.ndarray

    @staticmethod
    def none() -> Breakers:
        empty = np.zeros(0, dtype=np.int64)
        return Breakers(empty, {}, empty)


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


def _one_breaker(vocabulary: Sequence[str], breaker: str) -> dict[int, frozenset[tuple[int, ...]]]:
    """One breaker against the vocabulary (llama.cpp's ``get_overlapping_token_sequences``): head id ->
    the tails that must follow it (``()``: the head's text holds the whole breaker)."""
    found: dict[int, set[tuple[int, ...]]] = {}
    rest_len = len(breaker) - 1
    overlaps: list[tuple[int, int]] = []  # (id, characters of the breaker its text ends with)
    first = breaker[0]
    for token, text in enumerate(vocabulary):
        if breaker in text:
            found[token] = {()}
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
                found.setdefault(token, set()).add(tail[:MAX_DRY_TAIL_TOKENS])
    return {token: frozenset(tails) for token, tails in found.items()}


#: (id of the vocabulary, breaker) -> (the vocabulary, its table): the vocabulary is held so its id stays its own.
_KEPT: Kept[tuple[Sequence[str], dict[int, frozenset[tuple[int, ...]]]]] = Kept(BREAKERS_KEPT, BREAKERS_BYTES)


def _breaker_table(vocabulary: Sequence[str], breaker: str) -> dict[int, frozenset[tuple[int, ...]]]:
    key = (id(vocabulary), breaker)
    hit = _KEPT.get(key)
    if hit is None or hit[0] is not vocabulary:
        table = _one_breaker(vocabulary, breaker)
        _KEPT.put(key, (vocabulary, table), deep_size(table) + 64)
        return table
    return hit[1]


def breakers_of(vocabulary: Sequence[str] | None, breakers: Sequence[str]) -> Breakers:
    """The breakers resolved against ``vocabulary`` (each token id's text). ``ValueError`` when there
    are breakers but no vocabulary (an engine without a tokenizer)."""
    if not breakers:
        return Breakers.none()
    if vocabulary is None:
        raise ValueError("sequence_breakers are matched against the tokenizer's vocabulary, which this engine "
                         "does not give (send sequence_breakers: [] to run without breakers)")
    tails: dict[int, set[tuple[int, ...]]] = {}
    for breaker in dict.fromkeys(breakers):
        for token, found in _breaker_table(vocabulary, breaker).items():
            tails.setdefault(token, set()).update(found)
    single = np.array(sorted(t for t, found in tails.items() if () in found), dtype=np.int64)
    # the longest tail first: llama.cpp keeps the longest that matches
    ordered = {t: tuple(sorted(found, key=len, reverse=True)) for t, found in tails.items()}
    return Breakers(single, ordered, np.array(sorted(tails), dtype=np.int64))


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
        for q in np.flatnonzero(np.isin(w, b.heads))[::-1]:
            q = int(q)
            i = n - 1 - q
            longest = -1
            for tail in b.tails[int(w[q])]:
                if len(tail) <= longest:
                    break
                if len(tail) <= i and all(int(w[q + 1 + o]) == t for o, t in enumerate(tail)):
                    longest = len(tail)
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
        k = 1
        while len(live) and k < cap:
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
            keep = ~np.isin(tokens, self._breakers.single)
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

