"""Contradictions between entries, found at admission: payloads that would leave a row with no token.

Entries apply in order and a mask is never undone, so a payload whose own entries leave some step's
row with no allowed token is refused, naming the two entries and the step. Exact for built-in kinds
(the engine's own masks ignored):

* at every output position ``n`` the allowed set is followed through the entries in order
  (``forced_sequence`` and ``min_tokens`` depend on ``n``); an empty set is a contradiction;
* scopes: entries scoped to ``reasoning`` and to ``answer`` never act at one step, so the entries of
  each phase are followed apart; an entry scoped to a phase counts its positions from the start of
  the phase's stretch, which may begin at any output position, so its positions are paired with the
  ``always`` entries' (each side's first ``MIXED_POINTS`` positions that differ, and its last);
* a ``thinking_budget`` end token that an allow-list excludes, a ban masks, or ``min_tokens`` masks
  acting at a step where the span can close (any position: a span the prompt opened counts its
  tokens) is a contradiction; with the request's reasoning delimiters the span closes in the
  reasoning phase, so an entry scoped to ``answer`` never meets it; a ``thinking_budget`` without
  delimiters needs the payload's ``reasoning`` entry;
* a ``forced_sequence`` that writes a phrase a ``banned_phrases`` entry of the same scope bans (its
  tokens, then its EOS) is a contradiction at the step the phrase's last token is due;
* ``multiple_choice`` (id choices) at its first position allows exactly its choices' first tokens;
  past it, each prefix of a choice that the entries let the output write is followed down the
  choices' trie: there it allows the next tokens of the choices it begins (and EOS after a whole
  choice, when the entry names it), met by the entries of its own position scale (its scope's, and
  position-free masks of ``always`` entries; a ``banned_phrases`` of its scope, which reads the
  same stretch of output as the choice; the phrase of a trigger of its scope where the prefix
  first ends with the trigger); an empty set there is a contradiction (``choice_problems``).
  Elsewhere in the position grid it is taken to allow every id;
* a ``trigger`` (id trigger and phrase) whose phrase a position-free mask of its scale masks
  (``trigger_problems``) is a contradiction: the phrase is forced wherever the trigger is written;
  so is a trigger that a ``forced_sequence`` of its scope writes (tokens, then EOS) and then goes
  on with other tokens than the phrase (up to its EOS), and a phrase stop id that a
  ``min_tokens`` of its scope masks where the phrase comes when the trigger is written at the
  earliest. Beside a choice of its scope the choice's walk decides instead (it knows where the
  trigger can be written).

Beyond that, ``trigger``, ``deadline`` and ``prompt_tokens`` act at moments or on tokens admission
does not know (where a trigger is written, the clock, the prompt), and ``python`` and plug-in
entries are opaque: all are skipped, and a row they leave with no token fails its request while it runs
(docs/specs.md). A ``prompt_tokens`` in ``restrict`` mode is checked where its request is realized,
as the allowed set the prompt makes it (``dynlogits.sdk.realization``). No torch."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from dynlogits.specs.errors import Problem, SpecError
from dynlogits.specs.limits import DEFAULT_LIMITS, SpecLimits

from .admission_work import walks_needed, work_problem
from .consistency_walks import choice_problems, trigger_problems
from .effects import MIXED_POINTS, SET_KINDS, EntrySets, PhraseAutomaton, forced_token, scope_of

__all__ = ["MIXED_POINTS", "VERDICTS", "check_consistency", "consistency_problems"]



@dataclass(frozen=True, slots=True)
class _State:
    """Tokens still allowed after some entries: every id except ``masked`` (``allowed is None``),
    or exactly ``allowed``; ``origin`` is the index of the entry that last restricted the set."""

    masked: frozenset[int]
    allowed: frozenset[int] | None
    origin: int | None


def _positions(entries: Sequence[Any]) -> list[int]:
    """Output positions whose behaviour differs: every step of each forced sequence (and the first
    EOS step after it), and each ``min_tokens`` boundary. Between them nothing changes."""
    longest = max((len(e.token_ids) for e in entries if e.kind == "forced_sequence"), default=0)
    points = set(range(longest + 1))
    for e in entries:
        if e.kind == "min_tokens":
            points.update((e.min_tokens - 1, e.min_tokens))
    return sorted(p for p in points if p >= 0)


def _reasoning(entries: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    return next(((tuple(e.start_token_ids), tuple(e.end_token_ids)) for e in entries if e.kind == "reasoning"), None)


def _phases(entry: Any, reasoning: object) -> frozenset[str]:
    """The phases an entry acts in (without reasoning delimiters every step is an answer step)."""
    phases = frozenset(("reasoning", "answer") if reasoning is not None else ("answer",))
    scope = scope_of(entry)
    return phases if scope == "always" else phases & {scope}


def _step(state: _State, i: int, entry: Any, n: int, paths: Sequence[str], mask: frozenset[int] | None,
          keep: frozenset[int] | None, at: str) -> tuple[_State, str | None]:
    """Apply entry ``i`` at position ``n`` (``at``: how the message names it), which masks ``mask`` or
    keeps ``keep`` there (``EntrySets.effect``); the reason when the row is left empty."""
    origin = paths[state.origin] if state.origin is not None else ""
    if mask is not None:
        if state.allowed is None:
            return _State(state.masked | mask, None, state.origin), None
        left = state.allowed - mask
        why = None if left else f"masks every token {origin} leaves allowed at {at}"
        return _State(state.masked, left, state.origin), why
    kind = entry.kind
    if kind == "forced_sequence":
        token = forced_token(entry, n)
        ok = token not in state.masked if state.allowed is None else token in state.allowed
        why = None if ok else f"forces token {token} at {at}, which " + (
            "an earlier entry masks" if state.allowed is None else f"{origin} does not allow")
        return _State(state.masked, frozenset((token,)) if ok else frozenset(), i), why
    if keep is not None:  # allowed_tokens, or multiple_choice at its first position
        left = keep - state.masked if state.allowed is None else keep & state.allowed
        why = None
        if not left:
            what = "tokens that" if kind == "allowed_tokens" else "its choices' first tokens, which"
            why = (f"allows only {what} earlier entries mask" if state.allowed is None
                   else f"allows none of the tokens {origin} leaves allowed") + f" at {at}"
        return _State(state.masked, left, i), why
    return state, None  # logit_bias, thinking_budget (checked apart), the kinds the module doc skips: no effect on the set


def _capped(points: list[int]) -> list[int]:
    return points if len(points) <= MIXED_POINTS + 1 else [*points[:MIXED_POINTS], points[-1]]


def _grid(entries: Sequence[Any], axes: Sequence[int]) -> list[tuple[int, int]]:
    """The (output position, phase position) pairs to check: one scale alone, every point that
    differs; both, each side's capped points where the output position can be at or after the
    phase position (a point stands for the positions up to the next one; the last for all after)."""
    always = _positions([e for e, a in zip(entries, axes) if a == 0])
    phase = _positions([e for e, a in zip(entries, axes) if a == 1])
    if 1 not in axes:
        return [(n, 0) for n in always]
    if 0 not in axes:
        return [(0, n) for n in phase]
    upper = {p: q - 1 for p, q in zip(always, always[1:])}
    return [(a, p) for a in _capped(always) for p in _capped(phase) if a not in upper or upper[a] >= p]


def _position_problems(entries: Sequence[Any], paths: Sequence[str], vocab_size: int | None, sets: EntrySets,
                       index: Sequence[int], axes: Sequence[int] | None = None, phase: str = "") -> Iterator[Problem]:
    """``axes[i]``: whether entry ``i`` counts output positions (0) or positions of ``phase`` (1);
    ``index[i]``: its index in the payload (``sets``). O(grid points x entries that act on the set,
    plus the set operations of each distinct state)."""
    # Steps are memoized on (entry, input state, what of n matters), so a long forced sequence costs
    # one cheap step per position instead of re-deriving large allowed sets at every position.
    axes = list(axes) if axes is not None else [0] * len(entries)
    # per entry: (id of the input state) << 33 | what of n matters -> (state, reason); int keys and
    # the states kept alive in a list allocate nothing the garbage collector follows on a hit
    memos: list[dict[int, tuple[_State, str | None]]] = [{} for _ in entries]
    alive: list[_State] = []  # every state made: its id stays unique
    start = _State(frozenset(), None, None)
    # an entry that leaves the set as it is can neither empty it nor make it cover the vocabulary
    acting = [(i, e, e.kind, axes[i], tuple(e.token_ids) if e.kind == "forced_sequence" else None, memos[i])
              for i, e in enumerate(entries) if e.kind in SET_KINDS]
    for ns in _grid(entries, axes):
        state = start
        for i, entry, kind, axis, forced, memo in acting:
            n = ns[axis]
            key = id(state) << 33 | ((forced[n] if n < len(forced) else entry.eos_token_id) + 2 if forced is not None else
                                     n < entry.min_tokens if kind == "min_tokens" else
                                     n == 0 if kind == "multiple_choice" else 0)
            hit = memo.get(key)
            if hit is None:
                at = f"{phase} position {n}" if axis else f"output position {n}"
                hit = memo[key] = _step(state, i, entry, n, paths, *sets.effect(index[i], n), at)
                alive.append(hit[0])
            state, why = hit
            if why is None and vocab_size is not None and state.allowed is None and len(state.masked) >= vocab_size:
                at = f"{phase} position {n}" if axis else f"output position {n}"
                why = f"masks the last of the {vocab_size} tokens at {at}"
            if why is not None:
                yield Problem(paths[i], f"contradicts the entries before it: it {why}; the row would have no token left")
                return  # one problem per payload: later ones follow from it


def _scoped_position_problems(entries: Sequence[Any], paths: Sequence[str], vocab_size: int | None,
                              sets: EntrySets) -> Iterator[Problem]:
    """``_position_problems`` per phase: the entries acting in it, each on its own position scale."""
    if all(scope_of(e) == "always" for e in entries):
        yield from _position_problems(entries, paths, vocab_size, sets, range(len(entries)))
        return
    reasoning = _reasoning(entries)
    for phase in ("reasoning", "answer"):
        acting = [i for i, e in enumerate(entries) if e.kind != "reasoning" and phase in _phases(e, reasoning)]
        found = list(_position_problems([entries[i] for i in acting], [paths[i] for i in acting], vocab_size, sets,
                                        acting, [0 if scope_of(entries[i]) == "always" else 1 for i in acting], phase))
        if found:
            yield found[0]
            return


def _delimiter_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    if _reasoning(entries) is not None:
        return
    for i, entry in enumerate(entries):
        if entry.kind == "thinking_budget" and (entry.start_token_ids is None or entry.end_token_ids is None):
            yield Problem(paths[i], "thinking_budget has no delimiters of its own (start/end) and the payload declares "
                                    "no reasoning delimiters (a reasoning entry, or the deployment's reasoning:)")
            return


def _answer_budget_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    """A ``thinking_budget`` scoped to ``answer`` on the request's reasoning delimiters: the reasoning
    span is never open in the answer, yet the scoped processor reads the prompt and the answer's
    stretch, so where the prompt opened a span it counts it as open and forces the end token into
    the answer (and otherwise does nothing). Refused: it can only do harm."""
    reasoning = _reasoning(entries)
    if reasoning is None:
        return
    for i, entry in enumerate(entries):
        if entry.kind == "thinking_budget" and scope_of(entry) == "answer" and _delimiters(entry, reasoning) == reasoning:
            yield Problem(f"{paths[i]}.scope", "a thinking_budget on the reasoning delimiters cannot be scoped to answer: "
                                               "the reasoning span is never open in the answer, yet a span the prompt "
                                               "opened would be counted there and its end token forced into the answer; "
                                               "scope it reasoning or always")
            return


def _delimiters(entry: Any, reasoning: tuple[tuple[int, ...], tuple[int, ...]] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A ``thinking_budget``'s delimiters: its own, else the request's reasoning delimiters."""
    start = tuple(entry.start_token_ids) if entry.start_token_ids is not None else reasoning[0]  # type: ignore[index]
    end = tuple(entry.end_token_ids) if entry.end_token_ids is not None else reasoning[1]  # type: ignore[index]
    return start, end


def _thinking_problems(entries: Sequence[Any], paths: Sequence[str], sets: EntrySets) -> Iterator[Problem]:
    """A ``thinking_budget``'s end tokens, forced where its span closes, against the entries acting
    there: masked by ``min_tokens``, a ban, a phrase ban (a phrase the end tokens hold, one-token
    phrases included: the end writes it, so its last token is masked where it is forced), or left
    out of an allow-list."""
    reasoning = _reasoning(entries)
    for i, entry in enumerate(entries):
        if entry.kind != "thinking_budget":
            continue
        start, end = _delimiters(entry, reasoning)
        ends = frozenset(end)
        closes = _phases(entry, reasoning)  # where it can force: its span is open at a reasoning step
        if (start, end) == reasoning:
            closes &= {"reasoning"}
        for j, other in enumerate(entries):
            if not closes & _phases(other, reasoning):
                continue  # never acts at a step where the span closes
            if other.kind == "min_tokens":
                clash = ends & sets.mask(j)
                if clash:
                    yield Problem(f"{paths[i]}.end_token_ids", f"token {min(clash)} is masked by {paths[j]} until output position {other.min_tokens}, and the span can be closed before that (a span the prompt opened counts its tokens), which would leave the row with no token")
                    return
            elif other.kind == "banned_tokens" and not ends.isdisjoint(sets.mask(j)):
                token = min(ends & sets.mask(j))
                yield Problem(f"{paths[i]}.end_token_ids", f"token {token} is banned by {paths[j]}, so closing a thinking span would leave the row with no token")
                return
            elif other.kind == "allowed_tokens" and not ends <= sets.keep(j):
                token = min(ends - sets.keep(j))
                yield Problem(f"{paths[i]}.end_token_ids", f"token {token} is not allowed by {paths[j]}, so closing a thinking span would leave the row with no token")
                return
            elif other.kind == "banned_phrases":
                k = _phrase_in(sets.automaton(j), end)
                if k is not None:
                    phrase = other.phrases[k]
                    why = (f"token {phrase[0]} is banned by {paths[j]}.phrases[{k}] (a one-token phrase)" if len(phrase) == 1
                           else f"the end tokens hold {paths[j]}.phrases[{k}], whose last token {phrase[-1]} the ban masks once the "
                                "rest is written")
                    yield Problem(f"{paths[i]}.end_token_ids", f"{why}, so closing a thinking span would leave the row with no token")
                    return


def _phrase_in(automaton: PhraseAutomaton, written: Sequence[int]) -> int | None:
    """The first phrase ``written`` holds (the shortest of those ending first), or ``None``: O(len(written))."""
    state = 0
    for token in written:
        state = automaton.step(state, token)
        k = automaton.shortest[state]
        if k is not None:
            return k
    return None


def _phrase_problems(entries: Sequence[Any], paths: Sequence[str], sets: EntrySets) -> Iterator[Problem]:
    """A forced sequence (its tokens, then its first EOS) that writes a banned phrase: the ban's
    automaton follows each forced sequence of its scope once, O(its length)."""
    for j, ban in enumerate(entries):
        if ban.kind != "banned_phrases":
            continue
        for i, forced in enumerate(entries):
            if forced.kind != "forced_sequence" or forced.scope != ban.scope:
                continue  # another scope sees another stretch of the output: not known before it runs
            automaton = sets.automaton(j)
            state = 0
            for n, token in enumerate((*forced.token_ids, forced.eos_token_id)):
                state = automaton.step(state, token)
                k = automaton.shortest[state]
                if k is not None:
                    phrase = ban.phrases[k]
                    yield Problem(f"{paths[j]}.phrases[{k}]",
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


def _key(entries: Sequence[Any], vocab_size: int | None) -> bytes | None:
    """A digest of the entries' content as JSON (msgspec structs as they are, pydantic models as
    dumped), with ``vocab_size``; ``None`` for entries of another shape (not memoized). A digest, so
    a kept verdict costs some hundred bytes whatever the payload's size."""
    try:
        content = _ENCODER.encode(entries)
    except (TypeError, ValueError, AttributeError, msgspec.EncodeError):
        return None
    return hashlib.blake2b(content, digest_size=20).digest() + b"|" + str(vocab_size).encode()


def _dumped(value: Any) -> Any:
    """A pydantic model's class and field values as they are (msgspec encodes them at C speed)."""
    if getattr(value, "__pydantic_fields__", None) is None:
        raise TypeError(f"not memoized: {type(value).__name__}")
    return {"@": f"{type(value).__module__}.{type(value).__qualname__}", **value.__dict__}


_ENCODER = msgspec.json.Encoder(enc_hook=_dumped)


def consistency_problems(entries: Iterable[Any], *, root: str = "", paths: Sequence[str] | None = None,
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


def _problems(entries: list[Any], names: list[str], vocab_size: int | None) -> list[Problem]:
    """``consistency_problems`` past the budget: every rule, entry ``i`` named ``names[i]``."""
    kinds = [e.kind for e in entries]
    if len(entries) == 1 and kinds[0] not in ("thinking_budget", "banned_tokens", "min_tokens"):
        return []  # one entry never contradicts itself, short of masking the whole vocabulary
    if "thinking_budget" in kinds:
        missing = [*_delimiter_problems(entries, names)] or [*_answer_budget_problems(entries, names)]
        if missing:
            return missing
    if not walks_needed(entries, vocab_size):
        return []  # fewer than two acting entries, or only masks and biases too few to cover the vocabulary
    sets = EntrySets(entries)
    problems = [*_scoped_position_problems(entries, names, vocab_size, sets), *_thinking_problems(entries, names, sets),
                *_phrase_problems(entries, names, sets)]
    return problems or [*choice_problems(entries, names, sets), *trigger_problems(entries, names, sets)]


def check_consistency(entries: Iterable[Any], *, root: str = "", paths: Sequence[str] | None = None,
                      vocab_size: int | None = None, limits: SpecLimits = DEFAULT_LIMITS) -> None:
    """Raise ``SpecError`` naming the entry that contradicts the ones before it (see the module doc),
    or the admission work budget the entries would exceed (``consistency_problems``)."""
    problems = consistency_problems(entries, root=root, paths=paths, vocab_size=vocab_size, limits=limits)
    if problems:
        raise SpecError(problems)
