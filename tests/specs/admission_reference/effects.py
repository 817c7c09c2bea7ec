"""What an entry does to a step's row, as admission models it (``consistency``,
``consistency_walks``): the ids it masks or keeps at an output position, what of the position
that depends on, and which entries meet at one position scale. Wire entries in, no torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["MIXED_POINTS", "SET_KINDS", "EntrySets", "PhraseAutomaton", "forced_token", "keep_set", "mask_or_keep", "on_scale", "scope_of", "variant"]

#: Positions of each side compared where entries of two position scales act in one phase
#: (``consistency``'s module doc): the first ones that differ, and the last (from which on nothing
#: changes).
MIXED_POINTS = 64
#: The kinds whose effect on a step's allowed set the position rules follow (the others leave it as it is).
SET_KINDS = frozenset(("banned_tokens", "allowed_tokens", "min_tokens", "forced_sequence", "multiple_choice"))


def forced_token(entry: Any, n: int) -> int:
    """The token a ``forced_sequence`` forces at output position ``n`` (its EOS past the end)."""
    ids = entry.token_ids
    return ids[n] if n < len(ids) else entry.eos_token_id


def keep_set(entry: Any) -> frozenset[int]:
    """The ids an ``allowed_tokens`` entry keeps: its ids and its EOS."""
    ids = set(entry.token_ids)
    if entry.eos_token_id is not None:
        ids.add(entry.eos_token_id)
    return frozenset(ids)


def scope_of(entry: Any) -> str:
    """The entry's scope (``always`` for kinds without one)."""
    return getattr(entry, "scope", "always")


def variant(entry: Any, n: int) -> object:
    """What of position ``n`` an entry's effect depends on (``None``: nothing)."""
    if entry.kind == "forced_sequence":
        return forced_token(entry, n)
    if entry.kind == "min_tokens":
        return n < entry.min_tokens
    if entry.kind == "multiple_choice":
        return n == 0
    return None


def mask_or_keep(entry: Any, n: int, sets: dict[int, frozenset[int]],
                 j: int) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """What a position-scaled entry does at position ``n``: ``(masked, kept)`` ids (``None``: nothing
    of that form); ``sets`` caches each entry's fixed id set by index."""
    kind = entry.kind
    if kind == "banned_tokens" or (kind == "min_tokens" and n < entry.min_tokens):
        if j not in sets:
            sets[j] = frozenset(entry.token_ids if kind == "banned_tokens" else entry.stop_token_ids)
        return sets[j], None
    if kind == "allowed_tokens":
        if j not in sets:
            sets[j] = keep_set(entry)
        return None, sets[j]
    if kind == "forced_sequence":
        return None, frozenset((forced_token(entry, n),))
    if kind == "multiple_choice" and n == 0 and entry.choices:
        return None, frozenset(choice[0] for choice in entry.choices)
    return None, None


def on_scale(entry: Any, scope: str) -> bool:
    """Whether ``entry`` meets an entry of ``scope`` at its positions, as far as admission knows:
    the same scope (a scoped entry's history is its phase's stretch, as for every entry of that
    scope, so a ``banned_phrases`` of it matches on the same tokens), or a position-free mask of an
    ``always`` entry (not a ``banned_phrases``: it reads the output before the stretch too)."""
    if scope_of(entry) == scope:
        return True
    return scope != "always" and scope_of(entry) == "always" and entry.kind in ("banned_tokens", "allowed_tokens")


class PhraseAutomaton:
    """An Aho-Corasick automaton over the phrases of one or more ``banned_phrases`` entries (its
    groups), built once per payload in O(their tokens).

    State ``0`` is the empty output; ``step(s, t)`` is the state after token ``t`` follows an output
    in state ``s`` (the longest suffix of the output that begins some phrase). ``hits[s]`` has bit
    ``g`` set when the output in state ``s`` ends with a phrase of group ``g``, so group ``g`` masks
    ``t`` after an output in state ``s`` exactly when ``hits[step(s, t)] >> g & 1``. With one group,
    ``shortest[s]`` is the index of the shortest phrase the output ends with (the first of equal
    phrases; ``None``: none) and ``own[s]`` the one ``s`` spells. Following one output of ``m`` tokens
    costs O(m) steps in all: each fallback shortens the matched suffix."""

    __slots__ = ("goto", "fail", "hits", "shortest", "own")

    def __init__(self, groups: Sequence[Sequence[Sequence[int]]]) -> None:
        goto: list[dict[int, int]] = [{}]
        own: list[int | None] = [None]
        bits = [0]
        for g, phrases in enumerate(groups):
            for k, phrase in enumerate(phrases):
                s = 0
                for token in phrase:
                    nxt = goto[s].get(token)
                    if nxt is None:
                        nxt = goto[s][token] = len(goto)
                        goto.append({})
                        own.append(None)
                        bits.append(0)
                    s = nxt
                bits[s] |= 1 << g
                if own[s] is None and g == 0:
                    own[s] = k
        fail = [0] * len(goto)
        shortest = list(own)
        queue = list(goto[0].values())  # breadth first: a state's fallback is shallower, so done before it
        for s in queue:
            for token, child in goto[s].items():
                f = fail[s]
                while f and token not in goto[f]:
                    f = fail[f]
                back = goto[f].get(token, 0) if s else 0
                fail[child] = back
                bits[child] |= bits[back]
                if shortest[back] is not None:
                    shortest[child] = shortest[back]
                queue.append(child)
        self.goto, self.fail, self.hits, self.shortest, self.own = goto, fail, bits, shortest, own

    def masked(self, s: int) -> frozenset[int]:
        """Every id group 0 masks after an output in state ``s``: the last token of each phrase
        whose other tokens end the output (one-token phrases always). O(the suffixes' branches)."""
        goto, own, out = self.goto, self.own, set()
        while True:
            out.update(token for token, child in goto[s].items() if own[child] is not None)
            if not s:
                return frozenset(out)
            s = self.fail[s]

    def follow(self, written: Sequence[int]) -> int:
        """The state after ``written``."""
        s = 0
        for token in written:
            s = self.step(s, token)
        return s

    def step(self, s: int, token: int) -> int:
        """The state after ``token`` follows an output in state ``s``."""
        goto, fail = self.goto, self.fail
        while True:
            nxt = goto[s].get(token)
            if nxt is not None:
                return nxt
            if not s:
                return 0
            s = fail[s]


class EntrySets:
    """What admission reads of a payload's entries, built once per payload on first use and shared
    by every rule: each entry's fixed id set (``mask``: a ban's ids, ``min_tokens``' stop ids;
    ``keep``: an allow-list's ids and EOS, or a choice's first tokens), each ``banned_phrases``'
    automaton (``automaton``) and the automaton of several (``union``), each ``forced_sequence``'s
    output as text (``text``)."""

    __slots__ = ("entries", "_sets", "_automata", "_texts")

    def __init__(self, entries: Sequence[Any]) -> None:
        self.entries = entries
        self._sets: dict[int, frozenset[int]] = {}
        self._automata: dict[tuple[int, ...], PhraseAutomaton] = {}
        self._texts: dict[int, str] = {}

    def text(self, j: int) -> str:
        """What ``forced_sequence`` ``j`` writes (its tokens, then its EOS) as comma-led decimals
        (``",5,6,2,"``), for C-speed searches of a token sequence in it."""
        got = self._texts.get(j)
        if got is None:
            entry = self.entries[j]
            got = self._texts[j] = "," + ",".join(map(str, (*entry.token_ids, entry.eos_token_id))) + ","
        return got

    def mask(self, j: int) -> frozenset[int]:
        """The ids entry ``j`` (``banned_tokens`` or ``min_tokens``) masks when it acts."""
        got = self._sets.get(j)
        if got is None:
            entry = self.entries[j]
            ids = entry.token_ids if entry.kind == "banned_tokens" else entry.stop_token_ids
            got = self._sets[j] = frozenset(ids)
        return got

    def keep(self, j: int) -> frozenset[int]:
        """The ids entry ``j`` keeps: an ``allowed_tokens``' ids and EOS (``keep_set``), a
        ``multiple_choice``'s choices' first tokens (at its first position)."""
        got = self._sets.get(j)
        if got is None:
            entry = self.entries[j]
            got = keep_set(entry) if entry.kind == "allowed_tokens" else frozenset(c[0] for c in entry.choices)
            self._sets[j] = got
        return got

    def automaton(self, j: int) -> PhraseAutomaton:
        """Entry ``j``'s (``banned_phrases``) automaton."""
        return self.union((j,))

    def union(self, js: tuple[int, ...]) -> PhraseAutomaton:
        """The automaton of the ``banned_phrases`` entries ``js``, entry ``js[g]`` its group ``g``."""
        got = self._automata.get(js)
        if got is None:
            got = self._automata[js] = PhraseAutomaton([self.entries[j].phrases for j in js])
        return got

    def effect(self, j: int, n: int) -> tuple[frozenset[int] | None, frozenset[int] | None]:
        """``mask_or_keep`` of entry ``j`` at position ``n`` from the sets built once."""
        entry = self.entries[j]
        kind = entry.kind
        if kind == "banned_tokens" or (kind == "min_tokens" and n < entry.min_tokens):
            return self.mask(j), None
        if kind == "allowed_tokens" or (kind == "multiple_choice" and n == 0 and entry.choices):
            return None, self.keep(j)
        if kind == "forced_sequence":
            return None, frozenset((forced_token(entry, n),))
        return None, None
