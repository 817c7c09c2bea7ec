"""The admission work budget: an upper bound of the work the consistency checks (``consistency``,
``consistency_walks``) will do on a payload, from its sizes alone, before any walk starts.

A unit is about 0.1 µs of one CPU here (``python -m dynlogits.tools.bench admission`` measures it):
each count below is weighed by what one of its steps costs. Where work goes:

* the position rules: every grid point (output positions where a forced sequence or a
  ``min_tokens`` changes the row; for entries of two position scales, up to ``MIXED_POINTS + 1``
  of each side, paired) times the entries of its phase, and the id-set operations of each distinct
  state, no larger than the sets they combine;
* a ``thinking_budget``'s end tokens against each entry acting where its span closes;
* each ``banned_phrases``' automaton (its phrase tokens) and each forced sequence of its scope
  followed through it;
* each ``multiple_choice``'s trie (its choices' tokens) times the entries that meet it, phrases
  (one automaton step and their fallbacks) and triggers included;
* each ``trigger`` against the forced sequences of its scope and the masks of its scale;
* the id sets, built once.

``admission_work`` is O(entries), plus C-speed sums of the lengths of choices and phrases. No torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits.specs.errors import Problem
from dynlogits.specs.limits import SpecLimits

from .effects import MIXED_POINTS, SET_KINDS, on_scale, scope_of

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


#: The id fields of each built-in kind (phrases and choices apart).
_ID_FIELDS = {"forced_sequence": ("token_ids",), "banned_tokens": ("token_ids",), "allowed_tokens": ("token_ids",),
              "min_tokens": ("stop_token_ids",), "thinking_budget": ("start_token_ids", "end_token_ids"),
              "reasoning": ("start_token_ids", "end_token_ids"), "trigger": ("trigger_token_ids", "phrase_token_ids")}


def walks_needed(entries: Sequence[Any], vocab_size: int | None) -> bool:
    """Whether the consistency rules look at ``entries`` beyond their kinds and counts: fewer than
    two acting entries, or only masks and biases too few to cover the vocabulary, never contradict."""
    kinds = [e.kind for e in entries]
    if len(kinds) == 1 and kinds[0] not in ("thinking_budget", "banned_tokens", "min_tokens"):
        return False
    acting = [k for k in kinds if k != "reasoning"]
    if len(acting) < 2 and not (vocab_size is not None and acting and acting[0] in ("banned_tokens", "min_tokens")):
        return False
    if not any(k in ("forced_sequence", "allowed_tokens", "thinking_budget", "multiple_choice", "trigger") for k in kinds):
        masked = sum(len(e.token_ids if e.kind == "banned_tokens" else e.stop_token_ids)
                     for e in entries if e.kind in ("banned_tokens", "min_tokens"))
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


def _size(entry: Any) -> int:
    """The ids of an entry's fixed set (0: none)."""
    kind = entry.kind
    if kind in ("banned_tokens", "allowed_tokens"):
        return len(entry.token_ids) + (kind == "allowed_tokens")
    if kind == "min_tokens":
        return len(entry.stop_token_ids)
    if kind == "multiple_choice":
        return len(entry.choices)
    return 0


def _set_field(entry: Any) -> str:
    return {"min_tokens": "stop_token_ids", "multiple_choice": "choices", "forced_sequence": "token_ids"}.get(
        entry.kind, "token_ids")


def _position_work(tally: _Tally, entries: Sequence[Any], index: Sequence[int], axes: Sequence[int],
                   vocab_size: int | None) -> None:
    """The position rules over one phase's entries (``axes``: 0 output positions, 1 the phase's)."""
    def points(scale: int) -> int:
        longest = max((len(entries[i].token_ids) for i in range(len(entries))
                       if axes[i] == scale and entries[i].kind == "forced_sequence"), default=0)
        return longest + 1 + 2 * sum(1 for i in range(len(entries)) if axes[i] == scale and entries[i].kind == "min_tokens")

    both = 0 in axes and 1 in axes
    sides = (min(points(0), MIXED_POINTS + 1), min(points(1), MIXED_POINTS + 1)) if both else (points(axes[0] if axes else 0), 1)
    grid = sides[0] * sides[1]
    pieces = [1, 1]  # the distinct states so far: pieces of each scale the variants cut it into
    masked = 0.0  # the most ids a state without an allowed set masks so far
    kept: float = math.inf  # the fewest ids an allowed set holds so far (every position)
    firsts = 0  # the most first tokens a choice keeps at its first position
    longest, driver = 0, None
    for i, entry in enumerate(entries):
        kind, scale = entry.kind, axes[i]
        if kind == "forced_sequence":
            pieces[scale] += len(entry.token_ids)
            if len(entry.token_ids) >= longest:
                longest, driver = len(entry.token_ids), i
        elif kind in ("min_tokens", "multiple_choice"):
            pieces[scale] += 1
        states = min(grid, pieces[0] * pieces[1])
        size = _size(entry)
        if kind in ("banned_tokens", "min_tokens"):  # a union, or a difference iterating the allowed set
            cost = kept if kept < math.inf else size + masked + firsts
            masked = min(masked + size, vocab_size) if vocab_size is not None else masked + size
        elif kind == "allowed_tokens":
            cost = min(size, kept) if kept < math.inf else size
            kept = min(kept, size)
        elif kind == "multiple_choice":
            cost, firsts = size, max(firsts, size)
        elif kind == "forced_sequence":
            cost, kept = 1, 1
        else:
            continue
        if not (pieces[0] > 1 or pieces[1] > 1):
            states = 1
        tally.add(index[i], _set_field(entry), states * (STATE + cost * SET_ID), f"{states:,} states x {int(cost):,} ids")
    acting = sum(1 for e in entries if e.kind in SET_KINDS)
    target = index[driver] if driver is not None else index[0]
    field = "token_ids" if driver is not None else _set_field(entries[0])
    what = (f"{sides[0]:,} x {sides[1]:,} positions" if both else f"{grid:,} positions") + f" x {acting} entries"
    tally.add(target, field, grid * (acting + 1) * GRID_STEP, what)


def admission_work(entries: Sequence[Any], vocab_size: int | None = None) -> AdmissionWork:
    """An upper bound of the work units the consistency checks do on ``entries`` (wire entries,
    type-valid), from their sizes: see the module doc. O(entries)."""
    entries = list(entries)
    n = len(entries)
    if not walks_needed(entries, vocab_size):
        return AdmissionWork(n * ENTRY, ())
    tally = _Tally()
    kinds = [e.kind for e in entries]
    scopes = [scope_of(e) for e in entries]
    reasoning = next(((tuple(e.start_token_ids), tuple(e.end_token_ids)) for e in entries if e.kind == "reasoning"), None)
    for i, entry in enumerate(entries):  # every id set, built once
        size = _size(entry)
        if size:
            tally.add(i, _set_field(entry), size * SET_ID, f"{size:,} ids")
    # position rules: one pass, or one per phase with each entry on its scale
    if all(s == "always" for s in scopes):
        _position_work(tally, entries, range(n), [0] * n, vocab_size)
    else:
        phases = ("reasoning", "answer") if reasoning is not None else ("answer",)
        for phase in ("reasoning", "answer"):
            acting = [i for i in range(n) if kinds[i] != "reasoning" and phase in phases
                      and scopes[i] in ("always", phase)]
            if acting:
                _position_work(tally, [entries[i] for i in acting], acting,
                               [0 if scopes[i] == "always" else 1 for i in acting], vocab_size)
    phrase_tokens = {i: sum(map(len, e.phrases)) for i, e in enumerate(entries) if e.kind == "banned_phrases"}
    longest_phrase = {i: max(map(len, e.phrases), default=0) for i, e in enumerate(entries) if e.kind == "banned_phrases"}
    built: set[int] = set()  # phrase entries whose own automaton some rule builds

    def build(j: int) -> None:
        if j not in built:
            built.add(j)
            tally.add(j, "phrases", phrase_tokens[j] * BUILD_TOKEN, f"{phrase_tokens[j]:,} phrase tokens")

    # thinking budgets: their end tokens against every entry
    for i, entry in enumerate(entries):
        if entry.kind != "thinking_budget":
            continue
        end = len(entry.end_token_ids) if entry.end_token_ids is not None else len(reasoning[1]) if reasoning else 1
        cost = end * 2 * SET_ID + n * ENTRY  # its end tokens as a tuple and a set
        for j, other in enumerate(entries):
            if other.kind == "banned_phrases":
                build(j)
                cost += 2 * end * AUTOMATON_STEP
            elif other.kind in ("banned_tokens", "min_tokens", "allowed_tokens"):
                cost += (end if other.kind == "allowed_tokens" else min(end, _size(other))) * PROBE + min(end, 64) * SET_ID
        tally.add(i, "end_token_ids", cost, f"{end:,} end tokens x {n} entries")
    # forced sequences through the phrase automata of their scope
    for j, ban in enumerate(entries):
        if ban.kind != "banned_phrases":
            continue
        forced = [len(e.token_ids) + 1 for e in entries if e.kind == "forced_sequence" and scope_of(e) == scope_of(ban)]
        if forced:
            build(j)
            tally.add(j, "phrases", 2 * sum(forced) * AUTOMATON_STEP,
                      f"{phrase_tokens[j]:,} phrase tokens over {sum(forced):,} forced tokens")
    for i, entry in enumerate(entries):  # their text, for the triggers of their scope, once
        if entry.kind == "forced_sequence" and any(kinds[t] == "trigger" and scopes[t] == scopes[i] for t in range(n)):
            tally.add(i, "token_ids", (len(entry.token_ids) + 1) * TEXT_ID, f"{len(entry.token_ids) + 1:,} forced tokens")
    # choices down their tries
    unions: set[tuple[int, ...]] = set()
    for i, choice in enumerate(entries):
        if choice.kind != "multiple_choice" or not choice.choices:
            continue
        scope = scopes[i]
        meet = [j for j in range(n) if j != i and on_scale(entries[j], scope)]
        if not meet:
            continue
        tokens, count = sum(map(len, choice.choices)), len(choice.choices)
        phrases = tuple(j for j in meet if kinds[j] == "banned_phrases")
        cues = [j for j in meet if kinds[j] == "trigger" and scopes[j] == scope]
        fixed = [j for j in meet if kinds[j] in ("banned_tokens", "allowed_tokens", "min_tokens", "forced_sequence")]
        others = sum(1 for j in meet if kinds[j] == "multiple_choice")
        candidates = tokens + count  # every node's next tokens, and EOS after each whole choice
        cost = tokens * BUILD_CHOICE + (tokens + 1) * (NODE + 2 * len(cues) * CUE_STEP) \
            + candidates * (len(fixed) * TEST) + count * others * TEST \
            + (max(map(len, choice.choices)) + 1) * len(meet) * GRID_STEP
        if phrases:
            longest = min(max(longest_phrase[j] for j in phrases), 64)
            cost += (candidates + tokens + 2 * count * longest) * AUTOMATON_STEP
            cost += candidates * TEST
            if phrases not in unions:
                unions.add(phrases)
                union = sum(phrase_tokens[j] for j in phrases)
                tally.add(phrases[0], "phrases", union * BUILD_TOKEN, f"{union:,} phrase tokens")
            for j in phrases:  # a message reads each one's own
                build(j)
        met = len(fixed) + len(phrases) + len(cues)
        tally.add(i, "choices", cost, f"{tokens:,} tokens met by {met} entr{'y' if met == 1 else 'ies'}")
    # triggers: against the forced sequences of their scope, the masks of their scale
    walked = {scopes[i] for i in range(n) if kinds[i] == "multiple_choice" and entries[i].choices}
    for i, trigger in enumerate(entries):
        if kinds[i] != "trigger" or trigger.trigger_token_ids is None or trigger.phrase_token_ids is None:
            continue
        if scopes[i] in walked:
            continue
        length = len(trigger.trigger_token_ids) + len(trigger.phrase_token_ids)
        forced = sum(len(e.token_ids) + 1 for e in entries if e.kind == "forced_sequence" and scope_of(e) == scopes[i])
        masks = [j for j in range(n) if j != i and kinds[j] in ("banned_tokens", "allowed_tokens", "banned_phrases")
                 and on_scale(entries[j], scopes[i])]
        for j in masks:
            if kinds[j] == "banned_phrases":
                build(j)
        held = sum(1 for e in entries if e.kind == "min_tokens")
        tally.add(i, "trigger_token_ids", forced * SEARCH_ID + length * (len(masks) + held) * AUTOMATON_STEP + n * ENTRY,
                  f"{length} tokens x {len(masks)} masks, {forced:,} forced tokens")
    ids = sum(len(getattr(e, f) or ()) for e in entries for f in _ID_FIELDS.get(e.kind, ()))
    ids += sum(phrase_tokens.values()) + sum(sum(map(len, e.choices)) for e in entries if e.kind == "multiple_choice")
    total = n * ENTRY + ids * KEY_ID + sum(tally.units.values())
    drivers = sorted((Driver(i, f, math.ceil(u), tally.best[(i, f)][1]) for (i, f), u in tally.units.items()),
                     key=lambda d: -d.units)
    return AdmissionWork(math.ceil(total), tuple(drivers))


def work_problem(entries: Sequence[Any], paths: Sequence[str], vocab_size: int | None,
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
