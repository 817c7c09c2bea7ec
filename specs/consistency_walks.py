"""Contradictions found by following what a request can write (``consistency`` calls them once the
position rules found nothing): down the trie of an entry's ``choices`` over the prefixes the
entries let the output write, a ``cue``'s phrase forced where a prefix first ends with its trigger
(``choice_problems``), and a ``cue``'s phrase against the masks that act wherever it is written,
the masks that hold stop ids until a position where it can come first, and an output an entry
fixes (``writes``; ``trigger_problems``). Roles are read through each entry's ``KindRules``; each
problem names the entry where a row is left empty.

Cost: linear in what a walk visits. Id sets and phrase automata are built once per payload
(``EntrySets``); a walk carries each phrase ban's automaton state and each trigger's match state
down the choices' trie (never walking back), and tests each next token of a node against the
entries once; sets are built only for a message. ``dynlogits.specs.admission_work`` bounds it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .admission.rules import Entry
from .effects import EntrySets, on_scale, position_free, scope_of
from .errors import Problem

__all__ = ["choice_problems", "trigger_problems"]


def _output(written: Sequence[int]) -> str:
    """An output prefix as a message shows it: whole up to 8 tokens, else its ends and its length."""
    if len(written) <= 8:
        return str(list(written))
    return f"[{', '.join(map(str, written[:4]))}, ..., {', '.join(map(str, written[-2:]))}] ({len(written)} tokens)"


def _prefix_function(cue: Sequence[int]) -> list[int]:
    """Knuth-Morris-Pratt: ``pi[k]``, the longest proper prefix of ``cue[:k + 1]`` that ends it."""
    pi = [0] * len(cue)
    k = 0
    for q in range(1, len(cue)):
        while k and cue[q] != cue[k]:
            k = pi[k - 1]
        if cue[q] == cue[k]:
            k += 1
        pi[q] = k
    return pi


def choice_problems(entries: Sequence[Entry], paths: Sequence[str], sets: EntrySets | None = None) -> Iterator[Problem]:
    """Each entry with ``choices`` down their trie (see the module doc): every prefix the entries
    let the output write is visited once, so the walk is bounded by the choices' tokens times the
    entries that meet them. ``sets``: the payload's, shared with the other rules."""
    sets = sets if sets is not None else EntrySets(entries)
    for i, choice in enumerate(entries):
        choices = sets.rules[i].choices
        if choices is None or not choices(choice):
            continue
        scope = scope_of(choice)
        before = [j for j in range(i) if on_scale(entries[j], scope)]
        after = [j for j in range(i + 1, len(entries)) if on_scale(entries[j], scope)]
        if not before and not after:
            continue
        problem = _ChoiceWalk(entries, paths, sets, i, before, after).run()
        if problem is not None:
            yield problem
            return


class _ChoiceWalk:
    """One entry's ``choices`` (entry ``i``) down their trie, met by the entries ``before`` and
    ``after`` it on its position scale. The phrase bans among them share one automaton,
    entry ``phrase_js[g]`` its group ``g``."""

    def __init__(self, entries: Sequence[Entry], paths: Sequence[str], sets: EntrySets, i: int,
                 before: list[int], after: list[int]) -> None:
        self.entries, self.paths, self.sets, self.i = entries, paths, sets, i
        self.before, self.after = before, after
        self.scope = scope_of(entries[i])
        self.phrase_js = tuple(j for j in (*before, *after) if sets.rules[j].phrases is not None)
        self.cues = {j: cue for j in (*before, *after) if (cue := _cue_followed(sets, j, self.scope)) is not None}
        self.triggers = list(self.cues)
        skip = {*self.phrase_js, *self.triggers}
        self.fixed_before = [j for j in before if j not in skip]
        self.fixed_after = [j for j in after if j not in skip]
        self.levels: dict[int, tuple[list[tuple[frozenset[int] | None, frozenset[int] | None]], int | None,
                                     list[tuple[int, bool, frozenset[int]]]]] = {}

    def level(self, n: int) -> tuple[list[tuple[frozenset[int] | None, frozenset[int] | None]], int | None,
                                     list[tuple[int, bool, frozenset[int]]]]:
        """What the fixed entries do at position ``n``: the ``(mask, keep)`` of those before the
        choice with an effect there, the last of them that keeps (``None``: none), and those after
        it in order as ``(j, whether it keeps, ids)``."""
        got = self.levels.get(n)
        if got is None:
            effect = self.sets.effect
            made, origin = [], None
            for j in self.fixed_before:
                mask, keep = effect(j, n)
                if mask is not None or keep is not None:
                    made.append((mask, keep))
                if keep is not None:
                    origin = j
            later: list[tuple[int, bool, frozenset[int]]] = []
            for j in self.fixed_after:
                mask, keep = effect(j, n)
                if mask is not None:
                    later.append((j, False, mask))
                elif keep is not None:
                    later.append((j, True, keep))
            got = self.levels[n] = (made, origin, later)
        return got

    def run(self) -> Problem | None:
        entries, paths, i = self.entries, self.paths, self.i
        choice, rules = entries[i], self.sets.rules[i]
        assert rules.choices is not None and rules.choice_eos is not None, "a choice walk of an entry without choices"
        trie: dict[int, Any] = {}  # token -> child; the key -1 (never a token) marks a whole choice
        for ids in rules.choices(choice):
            node = trie
            for token in ids:
                node = node.setdefault(token, {})
            node[-1] = True
        phrase_js = self.phrase_js
        automaton = self.sets.union(phrase_js) if phrase_js else None
        goto, hits, step = (automaton.goto, automaton.hits, automaton.step) if automaton else ([{}], [0], None)
        before_bits = sum(1 << g for g, j in enumerate(phrase_js) if j < i)
        after_bits = sum(1 << g for g, j in enumerate(phrase_js) if j > i)
        cues = [tuple(self.cues[j][0]) for j in self.triggers]
        pis = [_prefix_function(cue) for cue in cues]
        phrases = [self.cues[j][1] for j in self.triggers]
        eos_id = rules.choice_eos(choice)
        written: list[int] = []  # the output down to the node popped (a depth-first walk)
        # node, its position, the token that led to it, each trigger's state (>= 0: how much of its
        # trigger the output ends with; < 0: ~where its phrase starts), the automaton's state
        stack: list[tuple[dict[int, Any], int, int, tuple[int, ...], int]] = [(trie, 0, -1, (0,) * len(cues), 0)]
        while stack:
            node, n, token, cued, state = stack.pop()
            if n:
                del written[n - 1:]
                written.append(token)
            forcing = [(q, n - ~x) for q, x in enumerate(cued) if x < 0 and n - ~x < len(phrases[q])] if cues else ()
            made, origin, later = self.levels.get(n) or self.level(n)
            ends = -1 in node
            eos = eos_id if ends else None
            keep = [t for t in node if t != -1]
            if eos is not None and eos not in node:
                keep.append(eos)
            left: dict[int, int] = {}  # the tokens left, each with the automaton's state after it
            kills: list[int | None] = []  # for each token past the entries before: the later entry masking it
            for t in keep:
                for mask, only in made:
                    if (mask is not None and t in mask) or (only is not None and t not in only):
                        break
                else:
                    moved = goto[state].get(t)
                    if moved is None:
                        moved = step(state, t) if step else 0
                    hit = hits[moved]
                    if hit & before_bits:
                        continue
                    kill = None
                    for j, keeps, held in later:
                        if (t not in held) if keeps else (t in held):
                            kill = j
                            break
                    hit &= after_bits
                    if hit:
                        j = phrase_js[(hit & -hit).bit_length() - 1]
                        kill = j if kill is None or j < kill else kill
                    kills.append(kill)
                    if kill is None:
                        left[t] = moved
            why, blame = None, i
            if not kills:
                what = (f"the next tokens of its choices after {_output(written)}" if not ends else
                        f"EOS after the whole choice {_output(written)}" if len(node) == 1 else
                        f"EOS and the next tokens of its longer choices after the whole choice {_output(written)}")
                origin = self._origin(origin, made, written)
                why = f"allows only {what}, which " + ("earlier entries mask" if origin is None else f"{paths[origin]} does not allow")
            elif not left:
                blame = max(k for k in kills if k is not None)  # the entry after which no token is left (each kills one)
                keeps = next((keeps for j, keeps, _ in later if j == blame), False)
                why = ("allows none of the tokens" if keeps else "masks every token") + (
                    f" {paths[i]} leaves allowed after the output {_output(written)}")
            for by, k in forcing if why is None else ():  # a trigger's phrase: one token, after every entry
                forced = phrases[by][k]
                if forced in left:
                    left = {forced: left[forced]}
                    continue
                if ends and eos is None and forced not in keep:
                    left = {}
                    break  # it may be the request's stop token, which ends the choice: not known here
                culprit, verb = self._excluding(n, written, forced, keep)
                j = self.triggers[by]
                cue = len(cues[by])
                scale = "output" if self.scope == "always" else self.scope
                cued_at = f"once its trigger is written at {scale} positions {n - k - cue}..{n - k - 1}"
                there = f"after the output {_output(written)}" if culprit == i else f"at {scale} position {n}"
                if j > culprit:
                    why = f"forces token {forced} (phrase_token_ids[{k}]) {there} {cued_at}, which {paths[culprit]} {verb}"
                else:
                    why = f"{verb} token {forced} {there}, which {paths[j]} forces (its phrase_token_ids[{k}]) {cued_at}"
                return Problem(paths[max(j, culprit)], f"contradicts the entries before it: it {why}; "
                                                      "the row would have no token left")
            if why is not None:
                if ends and eos is None:
                    continue  # a whole choice, its EOS the request's stop token: not known here
                scale = "output" if self.scope == "always" else self.scope
                return Problem(paths[blame], f"contradicts the entries before it: it {why} at {scale} position {n}; "
                                             "the row would have no token left")
            for t in node:
                if t != -1 and t in left:
                    stack.append((node[t], n + 1, t, _cued(cued, cues, pis, n, t) if cues else cued, left[t]))
        return None

    def _origin(self, origin: int | None, made: list[tuple[frozenset[int] | None, frozenset[int] | None]],
                written: Sequence[int]) -> int | None:
        """The entry the message blames for the set the choice met (the last allow-list before it),
        or ``None`` when there is none or a phrase ban before the choice took ids from its set."""
        if origin is None:
            return None
        taken: set[int] = set()
        for j in self.phrase_js:
            if j > self.i:
                break
            automaton = self.sets.automaton(j)
            mask = automaton.masked(automaton.follow(written))
            if any(m not in taken and all((no is None or m not in no) and (only is None or m in only) for no, only in made)
                   for m in mask):
                return None
            taken |= mask
        return origin

    def _excluding(self, n: int, written: Sequence[int], token: int, keep: list[int]) -> tuple[int, str]:
        """The first entry that leaves ``token`` out at position ``n`` after ``written``, the
        choice itself when its choices do not go on with it, and its verb."""
        if token not in keep:
            return self.i, "does not allow"
        for j in sorted((*self.before, *self.after)):
            if j in self.phrase_js:
                automaton = self.sets.automaton(j)
                if automaton.shortest[automaton.step(automaton.follow(written), token)] is not None:
                    return j, "masks"
                continue
            mask, only = self.sets.effect(j, n)
            if mask and token in mask:
                return j, "masks"
            if only is not None and token not in only:
                return j, "does not allow"
        return self.i, "does not allow"


def _cued(cued: tuple[int, ...], cues: list[tuple[int, ...]], pis: list[list[int]], n: int, token: int) -> tuple[int, ...]:
    """Each trigger's state once ``token`` follows the output of length ``n`` (Knuth-Morris-Pratt;
    its first occurrence fires it: its phrase starts at ``n + 1``)."""
    made = []
    for x, cue, pi in zip(cued, cues, pis):
        if x >= 0:
            while x and cue[x] != token:
                x = pi[x - 1]
            if cue[x] == token:
                x += 1
            if x == len(cue):
                x = ~(n + 1)
        made.append(x)
    return tuple(made)


def _cue_followed(sets: EntrySets, j: int, scope: str) -> tuple[Sequence[int], Sequence[int]] | None:
    """The trigger and phrase ids the walk of a choice of ``scope`` follows entry ``j`` as: a trigger
    with ids of the same scope (it reads the same stretch of output, whose every token the choices
    fix); ``None`` for any other entry."""
    cue = sets.rules[j].cue
    entry = sets.entries[j]
    return cue(entry) if cue is not None and scope_of(entry) == scope else None


def trigger_problems(entries: Sequence[Entry], paths: Sequence[str], sets: EntrySets | None = None) -> Iterator[Problem]:
    """An entry's ``cue`` whose phrase a position-free mask of its scale masks (a ban, an
    allow-list, a phrase ban that trigger and phrase write): once the trigger is written the
    phrase is forced, so that token's row has none left; so is a phrase stop id a mask of its scope
    holds until a position (``_held_stop_problem``). A trigger those masks never let the
    output write never fires and is not followed. Beside a choice of its scope a trigger is left to
    the choice's walk (``choice_problems``), which follows it exactly."""
    sets = sets if sets is not None else EntrySets(entries)
    rules = sets.rules
    walked = {scope_of(e) for e, r in zip(entries, rules) if r.choices is not None and r.choices(e)}
    for i, trigger in enumerate(entries):
        cue_of = rules[i].cue
        cued = cue_of(trigger) if cue_of is not None else None
        if cued is None:
            continue
        if scope_of(trigger) in walked:
            continue  # a choice of its scope fixes where it can be written: its walk follows the trigger
        forced = _forced_trigger_problem(entries, paths, i, sets, cued)
        if forced is not None:
            yield forced
            return
        scope = scope_of(trigger)
        masks = [j for j, e in enumerate(entries)
                 if j != i and (position_free(rules[j]) or rules[j].phrases is not None) and on_scale(e, scope)]
        cue, phrase = tuple(cued[0]), tuple(cued[1])
        masking = _first_masking(entries, sets, masks, (*cue, *phrase))  # at each position of trigger, phrase
        if any(j is not None for j in masking[:len(cue)]):
            continue  # never written: never fires
        held = _held_stop_problem(entries, paths, i, sets, cued)
        if held is not None:
            yield held
            return
        for k, token in enumerate(phrase):
            j = masking[len(cue) + k]
            if j is not None:
                verb = "does not allow" if rules[j].form == "keep" else "masks"
                if j > i:
                    why = f"{verb} token {token}, which {paths[i]} forces (its phrase_token_ids[{k}]) once its trigger is written"
                else:
                    why = f"forces token {token} (phrase_token_ids[{k}]) once its trigger is written, which {paths[j]} {verb}"
                yield Problem(paths[max(i, j)], f"contradicts the entries before it: it {why}; the row would have no token left")
                return


def _first_masking(entries: Sequence[Entry], sets: EntrySets, masks: list[int], written: tuple[int, ...]) -> list[int | None]:
    """For each position ``k`` of ``written``: the first of the ``masks`` entries (in order) that
    leaves ``written[k]`` out after ``written[:k]`` (``None``: none). O(len(written) x masks)."""
    firsts: list[int | None] = [None] * len(written)
    for j in reversed(masks):  # the last one written wins: the first in order
        if sets.rules[j].phrases is not None:
            automaton, state = sets.automaton(j), 0
            for k, token in enumerate(written):
                state = automaton.step(state, token)
                if automaton.shortest[state] is not None:
                    firsts[k] = j
        else:
            held, keeps = sets.mask(j), sets.rules[j].form == "keep"
            for k, token in enumerate(written):
                if (token in held) != keeps:
                    firsts[k] = j
    return firsts


def _holds_until(sets: EntrySets, j: int) -> int | None:
    """The position of its scale entry ``j`` masks its ids until (``None``: not such a mask)."""
    if sets.rules[j].form != "mask":
        return None
    along = sets.along(j)
    return along.below if along is not None else None


def _held_stop_problem(entries: Sequence[Entry], paths: Sequence[str], i: int, sets: EntrySets,
                       ids: tuple[Sequence[int], Sequence[int]]) -> Problem | None:
    """Trigger ``i`` (``ids``: its trigger and phrase ids) against the masks of its scope that hold
    until a position (stop ids): the masks of its scale let the trigger be written (the caller
    checked), at the earliest from position ``s``, 0 unless a trigger token is a stop id masked
    until later; phrase token ``k`` is then forced at ``s + len(trigger) + k``, and a stop id masked
    there leaves that row empty. An entry of its scope that fixes the output (a forced output,
    choices) fixes where the trigger can be written: left to their checks."""
    trigger = entries[i]
    scope = scope_of(trigger)
    if any((r.writes is not None or r.choices is not None) and scope_of(e) == scope for e, r in zip(entries, sets.rules)):
        return None
    until = {j: bound for j, e in enumerate(entries) if (bound := _holds_until(sets, j)) is not None and scope_of(e) == scope}
    held = list(until)
    if not held:
        return None
    cue, phrase = ids
    stops = {j: sets.mask(j) for j in held}
    first = max([0, *(until[j] - c for j in held for c, t in enumerate(cue) if t in stops[j])])
    scale = "output" if scope == "always" else scope
    for k, token in enumerate(phrase):
        at = first + len(cue) + k
        j = next((j for j in held if token in stops[j] and at < until[j]), None)
        if j is None:
            continue
        bound = until[j]
        cued = f"at {scale} position {at} when its trigger is written at the earliest ({scale} positions {first}..{first + len(cue) - 1})"
        if j > i:
            why = f"masks token {token} before {scale} position {bound}, which {paths[i]} forces (its phrase_token_ids[{k}]) {cued}"
        else:
            why = f"forces token {token} (phrase_token_ids[{k}]) {cued}, which {paths[j]} masks before {scale} position {bound}"
        return Problem(paths[max(i, j)], f"contradicts the entries before it: it {why}; the row would have no token left")
    return None


def _first_end(text: str, length: int, cue: Sequence[int]) -> int | None:
    """The first position right after ``cue`` in an output of ``length`` tokens written out as
    ``text`` (``EntrySets.text``) that is still inside it (the cue ends before the last token), or
    ``None``. A C-speed text search."""
    at = text.find("," + ",".join(map(str, cue)) + ",")
    if at < 0:
        return None
    end = text.count(",", 0, at) + len(cue)
    return end if end < length else None


def _forced_trigger_problem(entries: Sequence[Entry], paths: Sequence[str], i: int, sets: EntrySets,
                            ids: tuple[Sequence[int], Sequence[int]]) -> Problem | None:
    """Trigger ``i`` (``ids``: its trigger and phrase ids) against each entry of its scope that
    fixes the output of its stretch (``KindRules.writes``: its tokens, then EOS), which the trigger
    reads too: where that output first ends with the trigger, the phrase's tokens must be the ones
    the output holds there (up to its EOS; past it only an engine ignoring EOS goes on)."""
    trigger = entries[i]
    scope = scope_of(trigger)
    scale = "output" if scope == "always" else scope
    cue, phrase = ids
    for j, entry in enumerate(entries):
        writes = sets.rules[j].writes
        if writes is None or scope_of(entry) != scope:
            continue
        written = writes(entry)
        end = _first_end(sets.text(j), len(written), cue)
        if end is None:
            continue  # the trigger is never written (or only as the EOS step ends the output)
        for k, token in enumerate(phrase[:len(written) - end]):
            there = written[end + k]
            if token == there:
                continue
            at = f"{scale} position {end + k}"
            cued = f"once its trigger is written at {scale} positions {end - len(cue)}..{end - 1}"
            if j > i:
                why = (f"forces token {there} at {at}, where {paths[i]} forces token {token} "
                       f"(its phrase_token_ids[{k}]) {cued}")
            else:
                why = f"forces token {token} (phrase_token_ids[{k}]) at {at} {cued}, where {paths[j]} forces token {there}"
            return Problem(paths[max(i, j)], f"contradicts the entries before it: it {why}; the row would have no token left")
    return None
