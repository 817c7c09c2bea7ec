"""Contradictions found by following what a request can write (``consistency`` calls them once the
position rules found nothing): down ``multiple_choice``'s trie over the prefixes the entries let
the output write, a trigger's phrase forced where a prefix first ends with it (``choice_problems``),
and a ``trigger``'s phrase against the masks that act wherever it is written, the ``min_tokens``
that hold stop ids where it can come first, and the output a ``forced_sequence`` fixes
(``trigger_problems``). Each names the entry where a row is left empty.

Cost: linear in what a walk visits. Id sets and phrase automata are built once per payload
(``EntrySets``); a walk carries each ``banned_phrases``' automaton state and each trigger's match
state down the choices' trie (never walking back), and tests each next token of a node against the
entries once; sets are built only for a message. ``dynlogits.specs.admission_work`` bounds it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from dynlogits.specs.errors import Problem

from .effects import EntrySets, on_scale, scope_of

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


def choice_problems(entries: Sequence[Any], paths: Sequence[str], sets: EntrySets | None = None) -> Iterator[Problem]:
    """Each ``multiple_choice`` down its choices' trie (see the module doc): every prefix the entries
    let the output write is visited once, so the walk is bounded by the choices' tokens times the
    entries that meet them. ``sets``: the payload's, shared with the other rules."""
    sets = sets if sets is not None else EntrySets(entries)
    for i, choice in enumerate(entries):
        if choice.kind != "multiple_choice" or not choice.choices:
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
    """One ``multiple_choice`` (entry ``i``) down its trie, met by the entries ``before`` and
    ``after`` it on its position scale. The ``banned_phrases`` among them share one automaton,
    entry ``phrase_js[g]`` its group ``g``."""

    def __init__(self, entries: Sequence[Any], paths: Sequence[str], sets: EntrySets, i: int,
                 before: list[int], after: list[int]) -> None:
        self.entries, self.paths, self.sets, self.i = entries, paths, sets, i
        self.before, self.after = before, after
        self.scope = scope_of(entries[i])
        self.phrase_js = tuple(j for j in (*before, *after) if entries[j].kind == "banned_phrases")
        self.triggers = [j for j in (*before, *after) if _follows_trigger(entries[j], self.scope)]
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
        choice = entries[i]
        trie: dict[int, Any] = {}  # token -> child; the key -1 (never a token) marks a whole choice
        for ids in choice.choices:
            node = trie
            for token in ids:
                node = node.setdefault(token, {})
            node[-1] = True
        phrase_js = self.phrase_js
        automaton = self.sets.union(phrase_js) if phrase_js else None
        goto, hits, step = (automaton.goto, automaton.hits, automaton.step) if automaton else ([{}], [0], None)
        before_bits = sum(1 << g for g, j in enumerate(phrase_js) if j < i)
        after_bits = sum(1 << g for g, j in enumerate(phrase_js) if j > i)
        cues = [tuple(entries[j].trigger_token_ids) for j in self.triggers]
        pis = [_prefix_function(cue) for cue in cues]
        phrases = [entries[j].phrase_token_ids for j in self.triggers]
        eos_id = choice.eos_token_id
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
                blame = max(kills)  # type: ignore[type-var]  # the entry after which no token is left
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


def _follows_trigger(entry: Any, scope: str) -> bool:
    """Whether the walk of a choice of ``scope`` follows this entry as a trigger: one with ids of the
    same scope (it reads the same stretch of output, whose every token the choices fix)."""
    return entry.kind == "trigger" and scope_of(entry) == scope and \
        entry.trigger_token_ids is not None and entry.phrase_token_ids is not None


def trigger_problems(entries: Sequence[Any], paths: Sequence[str], sets: EntrySets | None = None) -> Iterator[Problem]:
    """A ``trigger`` whose phrase a position-free mask of its scale masks (``banned_tokens``,
    ``allowed_tokens``, a ``banned_phrases`` that trigger and phrase write): once the trigger is
    written the phrase is forced, so that token's row has none left; so is a phrase stop id a
    ``min_tokens`` of its scope holds (``_held_stop_problem``). A trigger those masks never let the
    output write never fires and is not followed. Beside a choice of its scope a trigger is left to
    the choice's walk (``choice_problems``), which follows it exactly."""
    sets = sets if sets is not None else EntrySets(entries)
    walked = {scope_of(e) for e in entries if e.kind == "multiple_choice" and e.choices}
    for i, trigger in enumerate(entries):
        if trigger.kind != "trigger" or trigger.trigger_token_ids is None or trigger.phrase_token_ids is None:
            continue
        if scope_of(trigger) in walked:
            continue  # a choice of its scope fixes where it can be written: its walk follows the trigger
        forced = _forced_trigger_problem(entries, paths, i, sets)
        if forced is not None:
            yield forced
            return
        scope = scope_of(trigger)
        masks = [j for j, e in enumerate(entries)
                 if j != i and e.kind in ("banned_tokens", "allowed_tokens", "banned_phrases") and on_scale(e, scope)]
        cue, phrase = tuple(trigger.trigger_token_ids), tuple(trigger.phrase_token_ids)
        masking = _first_masking(entries, sets, masks, (*cue, *phrase))  # at each position of trigger, phrase
        if any(j is not None for j in masking[:len(cue)]):
            continue  # never written: never fires
        held = _held_stop_problem(entries, paths, i, sets)
        if held is not None:
            yield held
            return
        for k, token in enumerate(phrase):
            j = masking[len(cue) + k]
            if j is not None:
                verb = "does not allow" if entries[j].kind == "allowed_tokens" else "masks"
                if j > i:
                    why = f"{verb} token {token}, which {paths[i]} forces (its phrase_token_ids[{k}]) once its trigger is written"
                else:
                    why = f"forces token {token} (phrase_token_ids[{k}]) once its trigger is written, which {paths[j]} {verb}"
                yield Problem(paths[max(i, j)], f"contradicts the entries before it: it {why}; the row would have no token left")
                return


def _first_masking(entries: Sequence[Any], sets: EntrySets, masks: list[int], written: tuple[int, ...]) -> list[int | None]:
    """For each position ``k`` of ``written``: the first of the ``masks`` entries (in order) that
    leaves ``written[k]`` out after ``written[:k]`` (``None``: none). O(len(written) x masks)."""
    firsts: list[int | None] = [None] * len(written)
    for j in reversed(masks):  # the last one written wins: the first in order
        kind = entries[j].kind
        if kind == "banned_phrases":
            automaton, state = sets.automaton(j), 0
            for k, token in enumerate(written):
                state = automaton.step(state, token)
                if automaton.shortest[state] is not None:
                    firsts[k] = j
        else:
            held = sets.mask(j) if kind == "banned_tokens" else sets.keep(j)
            for k, token in enumerate(written):
                if (token in held) != (kind == "allowed_tokens"):
                    firsts[k] = j
    return firsts


def _held_stop_problem(entries: Sequence[Any], paths: Sequence[str], i: int, sets: EntrySets) -> Problem | None:
    """Trigger ``i`` against the ``min_tokens`` of its scope: the masks of its scale let the trigger
    be written (the caller checked), at the earliest from position ``s``, 0 unless a trigger token is
    a stop id ``min_tokens`` masks until later; phrase token ``k`` is then forced at ``s +
    len(trigger) + k``, and a stop id masked there leaves that row empty. A ``forced_sequence`` or
    ``multiple_choice`` of its scope fixes where the trigger can be written: left to their checks."""
    trigger = entries[i]
    scope = scope_of(trigger)
    if any(e.kind in ("forced_sequence", "multiple_choice") and scope_of(e) == scope for e in entries):
        return None
    held = [j for j, e in enumerate(entries) if e.kind == "min_tokens" and scope_of(e) == scope]
    if not held:
        return None
    cue, phrase = trigger.trigger_token_ids, trigger.phrase_token_ids
    stops = {j: sets.mask(j) for j in held}
    first = max([0, *(entries[j].min_tokens - c for j in held for c, t in enumerate(cue) if t in stops[j])])
    scale = "output" if scope == "always" else scope
    for k, token in enumerate(phrase):
        at = first + len(cue) + k
        j = next((j for j in held if token in stops[j] and at < entries[j].min_tokens), None)
        if j is None:
            continue
        bound = entries[j].min_tokens
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


def _forced_trigger_problem(entries: Sequence[Any], paths: Sequence[str], i: int, sets: EntrySets) -> Problem | None:
    """Trigger ``i`` against each ``forced_sequence`` of its scope, which fixes the output of its
    stretch (its tokens, then EOS) that the trigger reads too: where that output first ends with
    the trigger, the phrase's tokens must be the ones the sequence forces there (up to its EOS; past
    it only an engine ignoring EOS goes on)."""
    trigger = entries[i]
    scope = scope_of(trigger)
    scale = "output" if scope == "always" else scope
    cue, phrase = trigger.trigger_token_ids, trigger.phrase_token_ids
    for j, entry in enumerate(entries):
        if entry.kind != "forced_sequence" or scope_of(entry) != scope:
            continue
        written = (*entry.token_ids, entry.eos_token_id)
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
