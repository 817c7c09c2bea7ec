"""Contradictions between entries, found at admission: payloads that would leave a row with no token.

Entries apply in order and a mask is never undone, so a payload whose own entries leave some step's
row with no allowed token is refused, naming the two entries and the step. Each entry is read
through its kind's rules (``dynlogits.specs.admission``: ``KindRules``, declared in the kind's own
module), so the rules below name roles, never kinds; exact for the roles declared (the engine's
own masks ignored):

* at every position ``n`` the allowed set is followed through the entries in order (each entry's
  effect: a mask, an allow-list, a forced token, its choices' first tokens, depending on ``n`` as
  its ``along`` says); an empty set is a contradiction;
* scopes: entries scoped to ``reasoning`` and to ``answer`` never act at one step, so the entries of
  each phase are followed apart; an entry scoped to a phase counts its positions from the start of
  the phase's stretch, which may begin at any output position, so its positions are paired with the
  ``always`` entries' (each side's first ``MIXED_POINTS`` positions that differ, and its last);
* tokens an entry forces at steps no position names (``anywhere``: a span's end tokens, which may
  close it after any number of tokens) that an entry acting where they are forced masks, leaves
  out, or holds as a banned phrase (``meets_anywhere``) are a contradiction;
* an output an entry fixes (``writes``: its tokens, then its EOS) that holds a phrase a ban of the
  same scope bans is a contradiction at the step the phrase's last token is due;
* an entry with ``choices`` at its first position allows exactly its choices' first tokens; past
  it, each prefix of a choice that the entries let the output write is followed down the choices'
  trie, met by the entries of its own position scale (``choice_problems``); elsewhere in the
  position grid it is taken to allow every id;
* a ``cue`` (trigger ids, and a phrase forced once they are written) whose phrase a position-free
  mask of its scale masks, that an output fixed in its scope writes and then leaves, or whose
  phrase a mask holding until a position masks where it comes at the earliest
  (``trigger_problems``); beside a choice of its scope the choice's walk decides instead.

Each kind's own single-entry rules (``checks``) run first. An entry whose kind declares no role
(``OPAQUE``: it acts at moments or on tokens admission does not know, or runs code it cannot read,
plug-in kinds included) is skipped, and a row it leaves with no token fails its request while it
runs (docs/specs.md). No torch."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .admission.lookup import rules_of
from .admission.rules import Along, Delimiters, Entry, KindRules
from .admission_work import walks_needed, work_problem
from .consistency_walks import choice_problems, trigger_problems
from .effects import MIXED_POINTS, EntrySets, scope_of
from .errors import Problem, SpecError
from .kinds import kinds_generation
from .limits import DEFAULT_LIMITS, SpecLimits

__all__ = ["MIXED_POINTS", "VERDICTS", "check_consistency", "consistency_problems"]


@dataclass(frozen=True, slots=True)
class _State:
    """Tokens still allowed after some entries: every id except ``masked`` (``allowed is None``),
    or exactly ``allowed``; ``origin`` is the index of the entry that last restricted the set."""

    masked: frozenset[int]
    allowed: frozenset[int] | None
    origin: int | None


def _positions(alongs: Iterable[Along | None]) -> list[int]:
    """Output positions whose behaviour differs: every step of each forced sequence (and the first
    step past it), and each boundary an entry holds until. Between them nothing changes."""
    present = [a for a in alongs if a is not None]
    longest = max((len(a.sequence) for a in present if a.sequence is not None), default=0)
    points = set(range(longest + 1))
    for a in present:
        if a.below is not None:
            points.update((a.below - 1, a.below))
    return sorted(p for p in points if p >= 0)


def _reasoning(entries: Sequence[Entry], rules: Sequence[KindRules[Any]]) -> Delimiters | None:
    """The request's reasoning delimiters, declared by the first entry whose kind declares them."""
    return next((r.delimiters(e) for e, r in zip(entries, rules) if r.delimiters is not None), None)


def _phases(entry: Entry, reasoning: object) -> frozenset[str]:
    """The phases an entry acts in (without reasoning delimiters every step is an answer step)."""
    phases = frozenset(("reasoning", "answer") if reasoning is not None else ("answer",))
    scope = scope_of(entry)
    return phases if scope == "always" else phases & {scope}


def _step(state: _State, i: int, rules: KindRules[Any], paths: Sequence[str], mask: frozenset[int] | None,
          keep: frozenset[int] | None, at: str) -> tuple[_State, str | None]:
    """Apply entry ``i`` (of ``rules``) at a position (``at``: how the message names it), which masks
    ``mask`` or keeps ``keep`` there (``EntrySets.effect``); the reason when the row is left empty."""
    origin = paths[state.origin] if state.origin is not None else ""
    if mask is not None:
        if state.allowed is None:
            return _State(state.masked | mask, None, state.origin), None
        left = state.allowed - mask
        why = None if left else f"masks every token {origin} leaves allowed at {at}"
        return _State(state.masked, left, state.origin), why
    if keep is not None and rules.form == "force":
        token = next(iter(keep))
        ok = token not in state.masked if state.allowed is None else token in state.allowed
        why = None if ok else f"forces token {token} at {at}, which " + (
            "an earlier entry masks" if state.allowed is None else f"{origin} does not allow")
        return _State(state.masked, frozenset((token,)) if ok else frozenset(), i), why
    if keep is not None:  # an allow-list, or a choice at its first position
        left = keep - state.masked if state.allowed is None else keep & state.allowed
        why = None
        if not left:
            why = (f"allows only {rules.keep_words} earlier entries mask" if state.allowed is None
                   else f"allows none of the tokens {origin} leaves allowed") + f" at {at}"
        return _State(state.masked, left, i), why
    return state, None  # no effect on the set at this position


def _capped(points: list[int]) -> list[int]:
    return points if len(points) <= MIXED_POINTS + 1 else [*points[:MIXED_POINTS], points[-1]]


def _grid(entries: Sequence[Entry], axes: Sequence[int], alongs: Sequence[Along | None] | None = None) -> list[tuple[int, int]]:
    """The (output position, phase position) pairs to check: one scale alone, every point that
    differs; both, each side's capped points where the output position can be at or after the
    phase position (a point stands for the positions up to the next one; the last for all after).
    ``alongs``: the entries' ``KindRules.along``, when known."""
    if alongs is None:
        alongs = [along(e) if (along := rules_of(e).along) is not None else None for e in entries]
    always = _positions([a for a, x in zip(alongs, axes) if x == 0])
    phase = _positions([a for a, x in zip(alongs, axes) if x == 1])
    if 1 not in axes:
        return [(n, 0) for n in always]
    if 0 not in axes:
        return [(0, n) for n in phase]
    upper = {p: q - 1 for p, q in zip(always, always[1:])}
    return [(a, p) for a in _capped(always) for p in _capped(phase) if a not in upper or upper[a] >= p]


def _position_problems(paths: Sequence[str], vocab_size: int | None, sets: EntrySets,
                       index: Sequence[int], axes: Sequence[int] | None = None, phase: str = "") -> Iterator[Problem]:
    """``axes[i]``: whether entry ``index[i]`` of the payload (``sets``), named ``paths[i]``, counts
    output positions (0) or positions of ``phase`` (1). O(grid points x entries that act on the set,
    plus the set operations of each distinct state)."""
    # Steps are memoized on (entry, input state, what of n matters), so a long forced sequence costs
    # one cheap step per position instead of re-deriving large allowed sets at every position.
    axes = list(axes) if axes is not None else [0] * len(index)
    alongs = [sets.along(j) for j in index]
    # per entry: (id of the input state) << 33 | what of n matters -> (state, reason); int keys and
    # the states kept alive in a list allocate nothing the garbage collector follows on a hit
    memos: list[dict[int, tuple[_State, str | None]]] = [{} for _ in index]
    alive: list[_State] = []  # every state made: its id stays unique
    start = _State(frozenset(), None, None)
    # an entry that leaves the set as it is can neither empty it nor make it cover the vocabulary
    acting = []
    for i, j in enumerate(index):
        rules = sets.rules[j]
        if rules.form is not None:
            along = alongs[i] or _NOWHERE
            acting.append((i, j, rules, axes[i], along.sequence, along.after, along.below, along.first, memos[i]))
    for ns in _grid((), axes, alongs):
        state = start
        for i, j, rules, axis, forced, after, below, first, memo in acting:
            n = ns[axis]
            key = id(state) << 33 | ((forced[n] if n < len(forced) else after) + 2 if forced is not None else
                                     n < below if below is not None else n == 0 if first else 0)
            hit = memo.get(key)
            if hit is None:
                at = f"{phase} position {n}" if axis else f"output position {n}"
                hit = memo[key] = _step(state, i, rules, paths, *sets.effect(j, n), at)
                alive.append(hit[0])
            state, why = hit
            if why is None and vocab_size is not None and state.allowed is None and len(state.masked) >= vocab_size:
                at = f"{phase} position {n}" if axis else f"output position {n}"
                why = f"masks the last of the {vocab_size} tokens at {at}"
            if why is not None:
                yield Problem(paths[i], f"contradicts the entries before it: it {why}; the row would have no token left")
                return  # one problem per payload: later ones follow from it


_NOWHERE = Along()


def _scoped_position_problems(entries: Sequence[Entry], paths: Sequence[str], vocab_size: int | None,
                              sets: EntrySets, reasoning: Delimiters | None) -> Iterator[Problem]:
    """``_position_problems`` per phase: the entries acting in it, each on its own position scale."""
    if all(scope_of(e) == "always" for e in entries):
        yield from _position_problems(paths, vocab_size, sets, range(len(entries)))
        return
    for phase in ("reasoning", "answer"):
        acting = [i for i, e in enumerate(entries) if sets.rules[i].acts and phase in _phases(e, reasoning)]
        found = list(_position_problems([paths[i] for i in acting], vocab_size, sets,
                                        acting, [0 if scope_of(entries[i]) == "always" else 1 for i in acting], phase))
        if found:
            yield found[0]
            return


def _own_problems(entries: Sequence[Entry], paths: Sequence[str], rules: Sequence[KindRules[Any]],
                  reasoning: Delimiters | None) -> list[Problem]:
    """The kinds' own rules on single entries (``KindRules.checks``): each rule over every entry in
    order before the next rule; the first problem found."""
    for stage in range(max(len(r.checks) for r in rules)):
        for i, entry in enumerate(entries):
            checks = rules[i].checks
            if stage < len(checks):
                problem = checks[stage](entry, paths[i], reasoning)
                if problem is not None:
                    return [problem]
    return []


def _anywhere_problems(entries: Sequence[Entry], paths: Sequence[str], sets: EntrySets,
                       reasoning: Delimiters | None) -> Iterator[Problem]:
    """Tokens an entry forces at steps no position names (``KindRules.anywhere``: a span's end
    tokens), against each entry acting in a phase where they can be forced and what it does to
    them (``KindRules.meets_anywhere``: a mask, an allow-list leaving one out, a phrase they hold)."""
    rules = sets.rules
    for i, entry in enumerate(entries):
        anywhere = rules[i].anywhere
        if anywhere is None:
            continue
        forced = anywhere(entry, reasoning, _phases(entry, reasoning))
        for j, other in enumerate(entries):
            meets = rules[j].meets_anywhere
            if meets is None or not forced.phases & _phases(other, reasoning):
                continue  # never acts at a step where they are forced
            met = meets(other, j, sets, forced, paths[j])
            if met is not None:
                yield Problem(f"{paths[i]}.{rules[i].field}", met.clause + (forced.until if met.holds else forced.so))
                return


def _phrase_problems(entries: Sequence[Entry], paths: Sequence[str], sets: EntrySets) -> Iterator[Problem]:
    """An output an entry fixes (``KindRules.writes``: its tokens, then its first EOS) that holds a
    phrase a ban of the same scope bans: the ban's automaton follows each such output once, O(its
    length)."""
    rules = sets.rules
    for j, ban in enumerate(entries):
        banned = rules[j].phrases
        if banned is None:
            continue
        for i, forced in enumerate(entries):
            writes = rules[i].writes
            if writes is None or scope_of(forced) != scope_of(ban):
                continue  # another scope sees another stretch of the output: not known before it runs
            automaton = sets.automaton(j)
            state = 0
            for n, token in enumerate(writes(forced)):
                state = automaton.step(state, token)
                k = automaton.shortest[state]
                if k is not None:
                    phrase = banned(ban)[k]
                    yield Problem(f"{paths[j]}.{rules[j].field}[{k}]",
                                  f"{paths[i]} writes this phrase at output positions {n + 1 - len(phrase)}..{n}, "
                                  f"so it forces token {phrase[-1]} at output position {n}, which the ban masks; "
                                  "the row would have no token left")
                    return


class _Verdicts:
    """A small LRU of verdicts by key (bytes), bounded by count and by the bytes of its keys;
    thread-safe (admission may run on several threads of one process)."""

    def __init__(self, count: int, key_bytes: int) -> None:
        self.count, self.key_bytes = count, key_bytes
        self._held: OrderedDict[bytes, tuple[Problem, ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[Problem, ...] | None:
        with self._lock:
            got = self._held.get(key)
            if got is not None:
                self._held.move_to_end(key)
            return got

    def put(self, key: bytes, verdict: tuple[Problem, ...]) -> None:
        if len(key) > self.key_bytes:
            return
        with self._lock:
            if key in self._held:
                return
            self._held[key] = verdict
            self._bytes += len(key)
            while len(self._held) > self.count or self._bytes > self.key_bytes:
                old, _ = self._held.popitem(last=False)
                self._bytes -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._bytes = 0


#: Verdicts of the walks per process, by a digest of the entries' content and the vocabulary size:
#: the same payload checked by the worker, by the engine's input validation, and for each child of
#: ``n`` is walked once. 4,096 verdicts of some hundred bytes each (a digest key, at most a few
#: problems), 1 MiB of keys at most.
VERDICTS = _Verdicts(4096, 1 << 20)
_NAMED = re.compile(r"\x00(\d+)\x00")


def _key(entries: Sequence[Entry], vocab_size: int | None) -> bytes | None:
    """A digest of the entries' content as JSON (msgspec structs as they are, pydantic models as
    dumped), with ``vocab_size`` and the kinds in force (a plug-in's rules may change); ``None`` for entries of another shape (not memoized). A digest, so
    a kept verdict costs some hundred bytes whatever the payload's size."""
    try:
        content = _ENCODER.encode(entries)
    except (TypeError, ValueError, AttributeError, msgspec.EncodeError):
        return None
    return hashlib.blake2b(content, digest_size=20).digest() + f"|{vocab_size}|{kinds_generation()}".encode()


def _dumped(value: object) -> dict[str, object]:
    """A pydantic model's class and field values as they are (msgspec encodes them at C speed)."""
    if getattr(value, "__pydantic_fields__", None) is None:
        raise TypeError(f"not memoized: {type(value).__name__}")
    return {"@": f"{type(value).__module__}.{type(value).__qualname__}", **value.__dict__}


_ENCODER = msgspec.json.Encoder(enc_hook=_dumped)


def consistency_problems(entries: Iterable[Entry], *, root: str = "", paths: Sequence[str] | None = None,
                         vocab_size: int | None = None, limits: SpecLimits = DEFAULT_LIMITS) -> list[Problem]:
    """The contradictions in ``entries`` (wire entries, already type-valid and below ``vocab_size``
    when it is given), at most one per rule. Entry ``i`` is named ``paths[i]`` (default
    ``root[i]``). With ``vocab_size`` (the logits width) masks that cover every token are found too.

    First, from the entries' sizes alone, the work the checks would take against
    ``limits.max_admission_work`` (``admission_work``): over it, the one problem names the budget at
    the field that drives most of it, and nothing is walked. Verdicts are kept per process by
    content (``VERDICTS``), whatever the entries are named, and a kept one is answered without the
    budget (nothing is walked); entries admitted against a width are admitted without one too (what
    the worker admitted, vLLM's input validation in the same process finds kept)."""
    entries = list(entries)
    names = list(paths) if paths is not None else [f"{root}[{i}]" for i in range(len(entries))]
    key = _key(entries, vocab_size)
    verdict = VERDICTS.get(key) if key is not None else None
    if verdict is None:  # a verdict kept costs no walk: the budget bounds the walks
        over = work_problem(entries, names, vocab_size, limits)
        if over is not None:
            return [over]
        verdict = tuple(_problems(entries, [f"\x00{i}\x00" for i in range(len(entries))], vocab_size))
        if key is not None:
            VERDICTS.put(key, verdict)
            if not verdict and vocab_size is not None:  # without the width the checks are a subset
                VERDICTS.put(_key(entries, None) or b"", verdict)

    def named(text: str) -> str:
        return _NAMED.sub(lambda m: names[int(m[1])], text) if "\x00" in text else text

    return [Problem(named(p.path), named(p.rule)) for p in verdict]


def _problems(entries: list[Entry], names: list[str], vocab_size: int | None) -> list[Problem]:
    """``consistency_problems`` past the budget: every rule, entry ``i`` named ``names[i]``."""
    rules = [rules_of(e) for e in entries]
    late = _after_last(entries, names, rules)
    if late is not None:
        return [late]
    if len(entries) == 1 and not rules[0].alone:
        return []  # one entry never contradicts itself, short of masking the whole vocabulary
    reasoning = _reasoning(entries, rules)
    if any(r.checks for r in rules):
        missing = _own_problems(entries, names, rules, reasoning)
        if missing:
            return missing
    if not walks_needed(entries, vocab_size):
        return []  # fewer than two acting entries, or only masks and biases too few to cover the vocabulary
    sets = EntrySets(entries)
    problems = [*_scoped_position_problems(entries, names, vocab_size, sets, reasoning),
                *_anywhere_problems(entries, names, sets, reasoning), *_phrase_problems(entries, names, sets)]
    return problems or [*choice_problems(entries, names, sets), *trigger_problems(entries, names, sets)]


def _after_last(entries: list[Entry], names: list[str], rules: list[KindRules[Any]]) -> Problem | None:
    """The first entry that acts after an entry whose kind must be the last that acts (``KindRules.last``)."""
    for i, rule in enumerate(rules):
        if rule.last:
            for j in range(i + 1, len(entries)):
                if rules[j].acts:
                    return Problem(names[j], f"comes after {names[i]} ({entries[i].kind}), which must be the last "
                                             f"entry that acts: {rule.last_why}; put {names[i]} last")
    return None


def check_consistency(entries: Iterable[Entry], *, root: str = "", paths: Sequence[str] | None = None,
                      vocab_size: int | None = None, limits: SpecLimits = DEFAULT_LIMITS) -> None:
    """Raise ``SpecError`` naming the entry that contradicts the ones before it (see the module doc),
    or the admission work budget the entries would exceed (``consistency_problems``)."""
    problems = consistency_problems(entries, root=root, paths=paths, vocab_size=vocab_size, limits=limits)
    if problems:
        raise SpecError(problems)
