"""What an entry does to a step's row, as admission models it (``consistency``,
``consistency_walks``), read through its kind's rules (``dynlogits.specs.admission``): the ids it
masks or keeps at a position, which entries meet at one position scale, and the phrase automata.
Wire entries in, no torch."""

from __future__ import annotations

from collections.abc import Sequence

from .admission.lookup import rules_of
from .admission.rules import Along, Entry, KindRules

__all__ = ["MIXED_POINTS", "EntrySets", "PhraseAutomaton", "on_scale", "position_free", "scope_of"]

#: Positions of each side compared where entries of two position scales act in one phase
#: (``consistency``'s module doc): the first ones that differ, and the last (from which on nothing
#: changes).
MIXED_POINTS = 64


def scope_of(entry: Entry) -> str:
    """The entry's scope (``always`` for kinds without one)."""
    return getattr(entry, "scope", "always")


def position_free(rules: KindRules[object]) -> bool:
    """Whether a kind's effect is a mask or an allow-list the same at every position."""
    return rules.along is None and rules.form in ("mask", "keep")


def on_scale(entry: Entry, scope: str) -> bool:
    """Whether ``entry`` meets an entry of ``scope`` at its positions, as far as admission knows:
    the same scope (a scoped entry's history is its phase's stretch, as for every entry of that
    scope, so a phrase ban of it matches on the same tokens), or a position-free mask of an
    ``always`` entry (not a phrase ban: it reads the output before the stretch too)."""
    if scope_of(entry) == scope:
        return True
    return scope != "always" and scope_of(entry) == "always" and position_free(rules_of(entry))


class PhraseAutomaton:
    """An Aho-Corasick automaton over the phrases of one or more phrase bans (its
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
        goto, own = self.goto, self.own
        out: set[int] = set()
        while True:
            out.update(token for token, child in goto[s].items() if own[child] is not None)
            if not s:
                return frozenset(out)
            s = self.fail[s]

    def first_in(self, written: Sequence[int]) -> int | None:
        """The first phrase (group 0) ``written`` holds (the shortest of those ending first), or
        ``None``: O(len(written))."""
        s = 0
        for token in written:
            s = self.step(s, token)
            k = self.shortest[s]
            if k is not None:
                return k
        return None

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
    by every rule: each entry's rules (``rules``), fixed id set (``mask``, ``keep``: its rules'
    ``ids``) and dependence on the position (``along``), each phrase ban's automaton
    (``automaton``) and the automaton of several (``union``), each forced output as text
    (``text``)."""

    __slots__ = ("entries", "rules", "_sets", "_alongs", "_automata", "_texts")

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = entries
        self.rules = [rules_of(entry) for entry in entries]
        self._sets: dict[int, frozenset[int]] = {}
        self._alongs: dict[int, Along | None] = {}
        self._automata: dict[tuple[int, ...], PhraseAutomaton] = {}
        self._texts: dict[int, str] = {}

    def text(self, j: int) -> str:
        """What entry ``j`` writes (its rules' ``writes``: its tokens, then its EOS) as comma-led
        decimals (``",5,6,2,"``), for C-speed searches of a token sequence in it."""
        got = self._texts.get(j)
        if got is None:
            writes = self.rules[j].writes
            assert writes is not None, "text of an entry that writes no output"
            got = self._texts[j] = "," + ",".join(map(str, writes(self.entries[j]))) + ","
        return got

    def mask(self, j: int) -> frozenset[int]:
        """The ids entry ``j`` masks when it acts (a mask's ``ids``)."""
        got = self._sets.get(j)
        if got is None:
            ids = self.rules[j].ids
            assert ids is not None, "ids of an entry without a fixed set"
            got = self._sets[j] = ids(self.entries[j])
        return got

    #: The ids entry ``j`` keeps where it acts (an allow-list's ``ids``; a choice's first tokens).
    keep = mask

    def along(self, j: int) -> Along | None:
        """What of a position entry ``j``'s effect depends on (``None``: nothing)."""
        if j in self._alongs:
            return self._alongs[j]
        along = self.rules[j].along
        got = self._alongs[j] = along(self.entries[j]) if along is not None else None
        return got

    def automaton(self, j: int) -> PhraseAutomaton:
        """Entry ``j``'s (a phrase ban) automaton."""
        return self.union((j,))

    def union(self, js: tuple[int, ...]) -> PhraseAutomaton:
        """The automaton of the phrase bans ``js``, entry ``js[g]`` its group ``g``."""
        got = self._automata.get(js)
        if got is None:
            groups = []
            for j in js:
                phrases = self.rules[j].phrases
                assert phrases is not None, "an automaton of an entry that bans no phrase"
                groups.append(phrases(self.entries[j]))
            got = self._automata[js] = PhraseAutomaton(groups)
        return got

    def effect(self, j: int, n: int) -> tuple[frozenset[int] | None, frozenset[int] | None]:
        """What entry ``j`` does at position ``n`` of its scale: ``(masked, kept)`` ids (``None``:
        nothing of that form), from the sets built once."""
        form = self.rules[j].form
        if form is None:
            return None, None
        along = self.along(j)
        if form == "mask":
            if along is None or along.below is None or n < along.below:
                return self.mask(j), None
            return None, None
        if form == "keep":
            return None, self.keep(j)
        if form == "first":
            return (None, self.keep(j)) if n == 0 and self.keep(j) else (None, None)
        assert along is not None and along.sequence is not None, "a forcing entry without its sequence"
        sequence = along.sequence
        return None, frozenset((sequence[n] if n < len(sequence) else along.after,))
