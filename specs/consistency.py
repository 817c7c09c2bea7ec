"""Contradictions between entries, found at admission: payloads that would leave a row with no token.

Entries apply in order and a mask is never undone, so a payload whose own entries leave some step's
row with no allowed token is refused, naming the two entries and the step. Exact for built-in kinds
(the engine's own masks ignored):

* at every output position ``n`` the allowed set is followed through the entries in order
  (``forced_sequence`` and ``min_tokens`` depend on ``n``); an empty set is a contradiction;
* a ``thinking_budget`` end token that an allow-list excludes, a ban masks, or ``min_tokens`` masks
  where the span could close is a contradiction whatever the step;
* a ``forced_sequence`` that writes a phrase a ``banned_phrases`` entry of the same scope bans (its
  tokens, then its EOS) is a contradiction at the step the phrase's last token is due.

``python`` and plug-in entries are opaque and skipped; what admission cannot know fails its request
while it runs (docs/specs.md). No torch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import Problem, SpecError

__all__ = ["check_consistency", "consistency_problems"]


@dataclass(frozen=True)
class _State:
    """Tokens still allowed after some entries: every id except ``masked`` (``allowed is None``),
    or exactly ``allowed``; ``origin`` is the index of the entry that last restricted the set."""

    masked: frozenset[int]
    allowed: frozenset[int] | None
    origin: int | None


def _forced_token(entry: Any, n: int) -> int:
    ids = entry.token_ids
    return ids[n] if n < len(ids) else entry.eos_token_id


def _keep_set(entry: Any) -> frozenset[int]:
    ids = set(entry.token_ids)
    if entry.eos_token_id is not None:
        ids.add(entry.eos_token_id)
    return frozenset(ids)


def _positions(entries: Sequence[Any]) -> list[int]:
    """Output positions whose behaviour differs: every step of each forced sequence (and the first
    EOS step after it), and each ``min_tokens`` boundary. Between them nothing changes."""
    longest = max((len(e.token_ids) for e in entries if e.kind == "forced_sequence"), default=0)
    points = set(range(longest + 1))
    for e in entries:
        if e.kind == "min_tokens":
            points.update((e.min_tokens - 1, e.min_tokens))
    return sorted(p for p in points if p >= 0)


def _step(state: _State, i: int, entry: Any, n: int, paths: Sequence[str]) -> tuple[_State, str | None]:
    """Apply entry ``i`` at position ``n``; the reason when the row is left empty."""
    kind = entry.kind
    origin = paths[state.origin] if state.origin is not None else ""
    if kind == "banned_tokens" or (kind == "min_tokens" and n < entry.min_tokens):
        ids = frozenset(entry.token_ids if kind == "banned_tokens" else entry.stop_token_ids)
        if state.allowed is None:
            return _State(state.masked | ids, None, state.origin), None
        left = state.allowed - ids
        why = None if left else f"masks every token {origin} leaves allowed at output position {n}"
        return _State(state.masked, left, state.origin), why
    if kind == "allowed_tokens":
        keep = _keep_set(entry)
        left = keep - state.masked if state.allowed is None else keep & state.allowed
        why = None
        if not left:
            why = ("allows only tokens that earlier entries mask" if state.allowed is None
                   else f"allows none of the tokens {origin} leaves allowed") + f" at output position {n}"
        return _State(state.masked, left, i), why
    if kind == "forced_sequence":
        token = _forced_token(entry, n)
        ok = token not in state.masked if state.allowed is None else token in state.allowed
        why = None if ok else f"forces token {token} at output position {n}, which " + (
            "an earlier entry masks" if state.allowed is None else f"{origin} does not allow")
        return _State(state.masked, frozenset((token,)) if ok else frozenset(), i), why
    return state, None  # logit_bias, thinking_budget (checked apart), python, plug-ins: no effect on the set


def _variant(entry: Any, n: int) -> object:
    """What of position ``n`` an entry's effect depends on (``None``: nothing)."""
    if entry.kind == "forced_sequence":
        return _forced_token(entry, n)
    if entry.kind == "min_tokens":
        return n < entry.min_tokens
    return None


def _position_problems(entries: Sequence[Any], paths: Sequence[str], vocab_size: int | None) -> Iterator[Problem]:
    # Steps are memoized on (entry, input state, what of n matters), so a long forced sequence costs
    # one cheap step per position instead of re-deriving large allowed sets at every position.
    memo: dict[tuple[int, int, object], tuple[_State, str | None]] = {}
    start = _State(frozenset(), None, None)
    for n in _positions(entries):
        state = start
        for i, entry in enumerate(entries):
            key = (i, id(state), _variant(entry, n))
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = _step(state, i, entry, n, paths)
                memo[(-1, id(hit[0]), None)] = (hit[0], None)  # keep the state alive: its id stays unique
            state, why = hit
            if why is None and vocab_size is not None and state.allowed is None and len(state.masked) >= vocab_size:
                why = f"masks the last of the {vocab_size} tokens at output position {n}"
            if why is not None:
                yield Problem(paths[i], f"contradicts the entries before it: it {why}; the row would have no token left")
                return  # one problem per payload: later ones follow from it


def _thinking_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    banned = {t: j for j, e in enumerate(entries) if e.kind == "banned_tokens" for t in e.token_ids}
    keeps = [(j, _keep_set(e)) for j, e in enumerate(entries) if e.kind == "allowed_tokens"]
    for i, entry in enumerate(entries):
        if entry.kind != "thinking_budget":
            continue
        earliest = len(entry.start_token_ids) + entry.budget  # the first output position it can force at
        for j, other in enumerate(entries):
            if other.kind == "min_tokens" and earliest < other.min_tokens:
                clash = sorted(set(entry.end_token_ids) & set(other.stop_token_ids))
                if clash:
                    yield Problem(f"{paths[i]}.end_token_ids", f"token {clash[0]} is masked by {paths[j]} until output position {other.min_tokens}, and the span can be closed from position {earliest} on, which would leave the row with no token")
                    return
        for token in entry.end_token_ids:
            if token in banned:
                yield Problem(f"{paths[i]}.end_token_ids", f"token {token} is banned by {paths[banned[token]]}, so closing a thinking span would leave the row with no token")
                return
            for j, keep in keeps:
                if token not in keep:
                    yield Problem(f"{paths[i]}.end_token_ids", f"token {token} is not allowed by {paths[j]}, so closing a thinking span would leave the row with no token")
                    return


def _phrase_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    """A forced sequence (its tokens, then its first EOS) that writes a banned phrase: one walk back
    from each position over a trie of the reversed phrases, at most ``max_phrase_tokens`` long."""
    for j, ban in enumerate(entries):
        if ban.kind != "banned_phrases":
            continue
        trie: dict[int, Any] = {}  # reversed phrases; the key -1 (never a token) holds a phrase's index
        for k, phrase in enumerate(ban.phrases):
            node = trie
            for token in reversed(phrase):
                node = node.setdefault(token, {})
            node.setdefault(-1, k)
        for i, forced in enumerate(entries):
            if forced.kind != "forced_sequence" or forced.scope != ban.scope:
                continue  # another scope sees another stretch of the output: not known before it runs
            written = (*forced.token_ids, forced.eos_token_id)
            for n in range(len(written)):
                node, back = trie, n
                while back >= 0 and (node := node.get(written[back])) is not None:
                    k = node.get(-1)
                    if k is not None:
                        phrase = ban.phrases[k]
                        yield Problem(f"{paths[j]}.phrases[{k}]",
                                      f"{paths[i]} writes this phrase at output positions {n + 1 - len(phrase)}..{n}, "
                                      f"so it forces token {phrase[-1]} at output position {n}, which the ban masks; "
                                      "the row would have no token left")
                        return
                    back -= 1


def consistency_problems(entries: Iterable[Any], *, root: str = "", paths: Sequence[str] | None = None,
                         vocab_size: int | None = None) -> list[Problem]:
    """The contradictions in ``entries`` (wire entries, already type-valid and below ``vocab_size``
    when it is given), at most one per rule. Entry ``i`` is named ``paths[i]`` (default
    ``root[i]``). With ``vocab_size`` (the logits width) masks that cover every token are found too."""
    entries = list(entries)
    if len(entries) < 2 and not (vocab_size is not None and entries and entries[0].kind in ("banned_tokens", "min_tokens")):
        return []  # one entry never contradicts itself, short of masking the whole vocabulary
    if not any(e.kind in ("forced_sequence", "allowed_tokens", "thinking_budget") for e in entries):
        masked = sum(len(e.token_ids if e.kind == "banned_tokens" else e.stop_token_ids)
                     for e in entries if e.kind in ("banned_tokens", "min_tokens"))
        if vocab_size is None or masked < vocab_size:
            return []  # only masks and biases, and too few masked ids to cover the vocabulary
    names = list(paths) if paths is not None else [f"{root}[{i}]" for i in range(len(entries))]
    return [*_position_problems(entries, names, vocab_size), *_thinking_problems(entries, names),
            *_phrase_problems(entries, names)]


def check_consistency(entries: Iterable[Any], *, root: str = "", paths: Sequence[str] | None = None,
                      vocab_size: int | None = None) -> None:
    """Raise ``SpecError`` naming the entry that contradicts the ones before it (see the module doc)."""
    problems = consistency_problems(entries, root=root, paths=paths, vocab_size=vocab_size)
    if problems:
        raise SpecError(problems)
