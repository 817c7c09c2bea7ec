"""The admission work budget: an upper bound of the work the consistency checks (``consistency``,
``consistency_walks``) will do on a payload, from its sizes alone, before any walk starts.

A unit is about 0.1 µs of one CPU here (``python -m dynlogits.tools.bench admission`` measures it):
each count below is weighed by what one of its steps costs. Where work goes:

* the position rules: every grid point (positions where a forced sequence or a mask holding
  until a position changes the row; for entries of two position scales, up to ``MIXED_POINTS + 1``
  of each side, paired) times the entries of its phase, and the id-set operations of each distinct
  state, no larger than the sets they combine;
* tokens forced anywhere (a span's end tokens) against each entry acting where they are forced;
* each phrase ban's automaton (its phrase tokens) and each forced output of its scope followed
  through it;
* each entry's ``choices`` trie (its choices' tokens) times the entries that meet it, phrases (one
  automaton step and their fallbacks) and triggers included;
* each ``cue`` against the forced outputs of its scope and the masks of its scale;
* the id sets, built once.

Each entry is weighed by its kind's rules (``dynlogits.specs.admission``: its form, ``size``,
roles and ``field``, the field its work is named by). ``admission_work`` is O(entries), plus C-speed sums of the lengths of choices and phrases. No torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .admission.lookup import rules_of
from .admission.rules import Along, Entry, KindRules
from .effects import MIXED_POINTS, on_scale, position_free, scope_of
from .errors import Problem
from .limits import SpecLimits

__all__ = ["AdmissionWork", "Driver", "admission_work", "walks_needed", "work_problem"]

# Units per step (a unit is ~0.1 µs): what one step of each kind costs in the checks, measured by
# ``python -m dynlogits.tools.bench admission`` on this machine and rounded up.
GRID_STEP = 3  # one entry at one grid point whose input state was seen before (a memo lookup)
STATE = 13  # one entry on a state not seen before (its step made, kept)
SET_ID = 0.7  # one id through a C set operation (build, union, difference, intersection)
PROBE = 0.2  # one id looked up in a set by a C loop (isdisjoint, issubset)
NODE = 5  # one node of a choice trie: popped, its next tokens listed, its level looked up
TEST = 1  # one next token tested against one entry
AUTOMATON_STEP = 1.5  # one step or one fallback of a phrase automaton
BUILD_CHOICE = 3  # one token of a choice trie built
BUILD_TOKEN = 12  # one token of a phrase automaton built (its fallback link included)
KEY_ID = 0.1  # one id of the payload encoded for the verdict memo
CUE_STEP = 4  # one trigger followed one token (Knuth-Morris-Pratt)
TEXT_ID = 1  # one id of a forced sequence written out as text, once
SEARCH_ID = 0.1  # one id of that text searched for a trigger
ENTRY = 40  # each entry, each rule


@dataclass(frozen=True)
class Driver:
    """Work one field of one entry drives: ``index`` of the entry, its ``field``, the ``units``, and
    ``what`` (the sizes that make them, as a message says them)."""

    index: int
    field: str
    units: int
    what: str


@dataclass(frozen=True)
class AdmissionWork:
    """The bound on a payload's admission work: its ``units`` and what drives them, largest first."""

    units: int
    drivers: tuple[Driver, ...]


def walks_needed(entries: Sequence[Entry], vocab_size: int | None) -> bool:
    """Whether the consistency rules look at ``entries`` beyond their kinds and counts: fewer than
    two acting entries, or only masks and biases too few to cover the vocabulary, never contradict."""
    rules = [rules_of(e) for e in entries]
    if len(rules) == 1 and not rules[0].alone:
        return False
    acting = [r for r in rules if r.acts]
    if len(acting) < 2 and not (vocab_size is not None and acting and acting[0].form == "mask"):
        return False
    if not any(r.contradicts for r in rules):
        masked = sum(_size(e, r) for e, r in zip(entries, rules) if r.form == "mask")
        return vocab_size is not None and masked >= vocab_size
    return True


class _Tally:
    """Units per (entry, field), each with the sizes of its largest contribution."""

    def __init__(self) -> None:
        self.units: dict[tuple[int, str], float] = {}
        self.best: dict[tuple[int, str], tuple[float, str]] = {}

    def add(self, index: int, field: str, units: float, what: str) -> None:
        key = (index, field)
        self.units[key] = self.units.get(key, 0.0) + units
        if units >= self.best.get(key, (-1.0, ""))[0]:
            self.best[key] = (units, what)


def _size(entry: Entry, rules: KindRules[Any]) -> int:
    """The ids of an entry's fixed set (0: none)."""
    return rules.size(entry) if rules.size is not None else 0


def _position_work(tally: _Tally, entries: Sequence[Entry], rules: Sequence[KindRules[Any]], index: Sequence[int],
                   axes: Sequence[int], vocab_size: int | None) -> None:
    """The position rules over one phase's entries (``axes``: 0 output positions, 1 the phase's)."""
    alongs = [r.along(e) if r.along is not None else _NOWHERE for e, r in zip(entries, rules)]

    def points(scale: int) -> int:
        longest = max((len(a.sequence) for a, x in zip(alongs, axes) if x == scale and a.sequence is not None), default=0)
        return longest + 1 + 2 * sum(1 for a, x in zip(alongs, axes) if x == scale and a.below is not None)

    both = 0 in axes and 1 in axes
    sides = (min(points(0), MIXED_POINTS + 1), min(points(1), MIXED_POINTS + 1)) if both else (points(axes[0] if axes else 0), 1)
    grid = sides[0] * sides[1]
    pieces = [1, 1]  # the distinct states so far: pieces of each scale the variants cut it into
    masked = 0.0  # the most ids a state without an allowed set masks so far
    kept: float = math.inf  # the fewest ids an allowed set holds so far (every position)
    firsts = 0  # the most first tokens a choice keeps at its first position
    longest, driver = 0, None
    for i, entry in enumerate(entries):
        along, scale, form = alongs[i], axes[i], rules[i].form
        if along.sequence is not None:
            pieces[scale] += len(along.sequence)
            if len(along.sequence) >= longest:
                longest, driver = len(along.sequence), i
        elif along.below is not None or along.first:
            pieces[scale] += 1
        states = min(grid, pieces[0] * pieces[1])
        size = _size(entry, rules[i])
        if form == "mask":  # a union, or a difference iterating the allowed set
            cost = kept if kept < math.inf else size + masked + firsts
            masked = min(masked + size, vocab_size) if vocab_size is not None else masked + size
        elif form == "keep":
            cost = min(size, kept) if kept < math.inf else size
            kept = min(kept, size)
        elif form == "first":
            cost, firsts = size, max(firsts, size)
        elif form == "force":
            cost, kept = 1, 1
        else:
            continue
        if not (pieces[0] > 1 or pieces[1] > 1):
            states = 1
        tally.add(index[i], rules[i].field, states * (STATE + cost * SET_ID), f"{states:,} states x {int(cost):,} ids")
    acting = sum(1 for r in rules if r.form is not None)
    target = index[driver] if driver is not None else index[0]
    field = rules[driver].field if driver is not None else rules[0].field if rules[0].form is not None else _GRID_FIELD
    what = (f"{sides[0]:,} x {sides[1]:,} positions" if both else f"{grid:,} positions") + f" x {acting} entries"
    tally.add(target, field, grid * (acting + 1) * GRID_STEP, what)


_NOWHERE = Along()
#: The field a grid without a forced sequence is blamed on when its first entry has no effect on the set.
_GRID_FIELD = "token_ids"


def admission_work(entries: Sequence[Entry], vocab_size: int | None = None) -> AdmissionWork:
    """An upper bound of the work units the consistency checks do on ``entries`` (wire entries,
    type-valid), from their sizes: see the module doc. O(entries)."""
    entries = list(entries)
    n = len(entries)
    if not walks_needed(entries, vocab_size):
        return AdmissionWork(n * ENTRY, ())
    tally = _Tally()
    rules = [rules_of(e) for e in entries]
    scopes = [scope_of(e) for e in entries]
    reasoning = next((r.delimiters(e) for e, r in zip(entries, rules) if r.delimiters is not None), None)
    for i, entry in enumerate(entries):  # every id set, built once
        size = _size(entry, rules[i])
        if size:
            tally.add(i, rules[i].field, size * SET_ID, f"{size:,} ids")
    # position rules: one pass, or one per phase with each entry on its scale
    if all(s == "always" for s in scopes):
        _position_work(tally, entries, rules, range(n), [0] * n, vocab_size)
    else:
        phases = ("reasoning", "answer") if reasoning is not None else ("answer",)
        for phase in ("reasoning", "answer"):
            acting = [i for i in range(n) if rules[i].acts and phase in phases and scopes[i] in ("always", phase)]
            if acting:
                _position_work(tally, [entries[i] for i in acting], [rules[i] for i in acting], acting,
                               [0 if scopes[i] == "always" else 1 for i in acting], vocab_size)
    banned = {i: bans(e) for i, (e, r) in enumerate(zip(entries, rules)) if (bans := r.phrases) is not None}
    phrase_tokens = {i: sum(map(len, p)) for i, p in banned.items()}
    longest_phrase = {i: max(map(len, p), default=0) for i, p in banned.items()}
    built: set[int] = set()  # phrase bans whose own automaton some rule builds

    def build(j: int) -> None:
        if j not in built:
            built.add(j)
            tally.add(j, rules[j].field, phrase_tokens[j] * BUILD_TOKEN, f"{phrase_tokens[j]:,} phrase tokens")

    # tokens forced anywhere (a span's end tokens) against every entry
    for i, entry in enumerate(entries):
        anywhere = rules[i].anywhere
        if anywhere is None:
            continue
        end = max(len(anywhere(entry, reasoning, frozenset()).tokens), 1)
        cost = end * 2 * SET_ID + n * ENTRY  # the tokens as a tuple and a set
        for j, other in enumerate(entries):
            if j in banned:
                build(j)
                cost += 2 * end * AUTOMATON_STEP
            elif rules[j].form in ("mask", "keep"):
                cost += (end if rules[j].form == "keep" else min(end, _size(other, rules[j]))) * PROBE + min(end, 64) * SET_ID
        tally.add(i, rules[i].field, cost, f"{end:,} end tokens x {n} entries")
    # forced outputs through the phrase automata of their scope
    cued = [i for i in range(n) if rules[i].cue is not None]
    # the length of each output fixed (written out only where a phrase ban or a trigger reads it)
    written = {i: len(writes(e)) for i, (e, r) in enumerate(zip(entries, rules))
               if (writes := r.writes) is not None} if banned or cued else {}
    for j in banned:
        forced = [length for i, length in written.items() if scopes[i] == scopes[j]]
        if forced:
            build(j)
            tally.add(j, rules[j].field, 2 * sum(forced) * AUTOMATON_STEP,
                      f"{phrase_tokens[j]:,} phrase tokens over {sum(forced):,} forced tokens")
    for i, length in written.items():  # their text, for the triggers of their scope, once
        if any(scopes[t] == scopes[i] for t in cued):
            tally.add(i, rules[i].field, length * TEXT_ID, f"{length:,} forced tokens")
    # choices down their tries
    unions: set[tuple[int, ...]] = set()
    walked: set[str] = set()
    for i, choice in enumerate(entries):
        listed = rules[i].choices
        choices = listed(choice) if listed is not None else ()
        if not choices:
            continue
        scope = scopes[i]
        walked.add(scope)
        meet = [j for j in range(n) if j != i and on_scale(entries[j], scope)]
        if not meet:
            continue
        tokens, count = sum(map(len, choices)), len(choices)
        phrases = tuple(j for j in meet if j in banned)
        cues = [j for j in meet if rules[j].cue is not None and scopes[j] == scope]
        fixed = [j for j in meet if rules[j].form in ("mask", "keep", "force")]
        others = sum(1 for j in meet if rules[j].choices is not None)
        candidates = tokens + count  # every node's next tokens, and EOS after each whole choice
        cost = tokens * BUILD_CHOICE + (tokens + 1) * (NODE + 2 * len(cues) * CUE_STEP) \
            + candidates * (len(fixed) * TEST) + count * others * TEST \
            + (max(map(len, choices)) + 1) * len(meet) * GRID_STEP
        if phrases:
            longest = min(max(longest_phrase[j] for j in phrases), 64)
            cost += (candidates + tokens + 2 * count * longest) * AUTOMATON_STEP
            cost += candidates * TEST
            if phrases not in unions:
                unions.add(phrases)
                union = sum(phrase_tokens[j] for j in phrases)
                tally.add(phrases[0], rules[phrases[0]].field, union * BUILD_TOKEN, f"{union:,} phrase tokens")
            for j in phrases:  # a message reads each one's own
                build(j)
        met = len(fixed) + len(phrases) + len(cues)
        tally.add(i, rules[i].field, cost, f"{tokens:,} tokens met by {met} entr{'y' if met == 1 else 'ies'}")
    # triggers: against the forced outputs of their scope, the masks of their scale
    held = sum(1 for e, r in zip(entries, rules) if r.form == "mask" and r.along is not None and r.along(e).below is not None)
    for i in cued:
        cue_of = rules[i].cue
        cue = cue_of(entries[i]) if cue_of is not None else None
        if cue is None or scopes[i] in walked:
            continue
        length = len(cue[0]) + len(cue[1])
        forced_tokens = sum(length_ for j, length_ in written.items() if scopes[j] == scopes[i])
        masks = [j for j in range(n) if j != i and (position_free(rules[j]) or j in banned) and on_scale(entries[j], scopes[i])]
        for j in masks:
            if j in banned:
                build(j)
        tally.add(i, rules[i].field, forced_tokens * SEARCH_ID + length * (len(masks) + held) * AUTOMATON_STEP + n * ENTRY,
                  f"{length} tokens x {len(masks)} masks, {forced_tokens:,} forced tokens")
    ids = sum(len(getattr(e, f) or ()) for e, r in zip(entries, rules) for f in r.id_fields)
    ids += sum(phrase_tokens.values())
    ids += sum(sum(map(len, r.choices(e))) for e, r in zip(entries, rules) if r.choices is not None)
    total = n * ENTRY + ids * KEY_ID + sum(tally.units.values())
    drivers = sorted((Driver(i, f, math.ceil(u), tally.best[(i, f)][1]) for (i, f), u in tally.units.items()),
                     key=lambda d: -d.units)
    return AdmissionWork(math.ceil(total), tuple(drivers))


def work_problem(entries: Sequence[Entry], paths: Sequence[str], vocab_size: int | None,
                 limits: SpecLimits) -> Problem | None:
    """The problem when ``entries`` (named ``paths``) would take more admission work than
    ``limits.max_admission_work``, at the field that drives most of it; ``None`` when within."""
    work = admission_work(entries, vocab_size)
    if work.units <= limits.max_admission_work:
        return None
    top = work.drivers[0]
    said = "; ".join(f"{paths[d.index]}.{d.field}: {d.what}" for d in work.drivers[:3])
    return Problem(f"{paths[top.index]}.{top.field}",
                   f"admission would take ~{work.units:,} units of work ({said}); the most allowed is "
                   f"{limits.max_admission_work:,} (limit max_admission_work)")
