"""Contradictions found by following what a request can write (``consistency`` calls them once the
position rules found nothing): down ``multiple_choice``'s trie over the prefixes the entries let
the output write, a trigger's phrase forced where a prefix first ends with it (``choice_problems``),
and a ``trigger``'s phrase against the masks that act wherever it is written, the ``min_tokens``
that hold stop ids where it can come first, and the output a ``forced_sequence`` fixes
(``trigger_problems``). Each names the entry where a row is left empty."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .effects import keep_set, mask_or_keep, on_scale, scope_of, variant
from .errors import Problem

__all__ = ["choice_problems", "trigger_problems"]


def _phrase_trie(entry: Any) -> dict[int, Any]:
    """A ``banned_phrases`` entry's phrases as a trie of their prefixes read backwards; the key -1
    (never a token) holds the last tokens a prefix ending there bans (the root's: one-token phrases)."""
    trie: dict[int, Any] = {-1: []}
    for phrase in entry.phrases:
        node = trie
        for token in reversed(phrase[:-1]):
            node = node.setdefault(token, {-1: []})
        node[-1].append(phrase[-1])
    return trie


def _phrase_masks(trie: dict[int, Any], written: Sequence[int]) -> frozenset[int]:
    """The ids a ``banned_phrases`` entry (its ``_phrase_trie``) masks after the output ``written``:
    a walk back from its last token, at most as long as the longest phrase."""
    masked, node = list(trie[-1]), trie
    for token in reversed(written):
        node = node.get(token)
        if node is None:
            break
        masked += node[-1]
    return frozenset(masked)


def _output(written: Sequence[int]) -> str:
    """An output prefix as a message shows it: whole up to 8 tokens, else its ends and its length."""
    if len(written) <= 8:
        return str(list(written))
    return f"[{', '.join(map(str, written[:4]))}, ..., {', '.join(map(str, written[-2:]))}] ({len(written)} tokens)"


def choice_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    """Each ``multiple_choice`` down its choices' trie (see the module doc): every prefix the entries
    let the output write is visited once, so the walk is bounded by the choices' tokens."""
    for i, choice in enumerate(entries):
        if choice.kind != "multiple_choice" or not choice.choices:
            continue
        scope = scope_of(choice)
        before = [j for j in range(i) if on_scale(entries[j], scope)]
        after = [j for j in range(i + 1, len(entries)) if on_scale(entries[j], scope)]
        if not before and not after:
            continue
        trie: dict[int, Any] = {}  # token -> child; the key -1 (never a token) marks a whole choice
        for ids in choice.choices:
            node = trie
            for token in ids:
                node = node.setdefault(token, {})
            node[-1] = True
        sets: dict[int, frozenset[int]] = {}
        phrases = {j: _phrase_trie(entries[j]) for j in (*before, *after) if entries[j].kind == "banned_phrases"}
        before_phrases = [j for j in before if j in phrases]
        after_phrases = [j for j in after if j in phrases]
        prefix: dict[int, tuple[Any, ...]] = {}
        made: dict[tuple[object, ...], tuple[Any, ...]] = {}
        triggers = [j for j in (*before, *after) if _follows_trigger(entries[j], scope)]
        fixed = [j for j in (*before, *after) if j not in phrases and j not in triggers]
        scale = "output" if scope == "always" else scope
        written: list[int] = []  # the output down to the node popped (a depth-first walk)
        unfired = (-1,) * len(triggers)
        cue_ends = frozenset(entries[j].trigger_token_ids[-1] for j in triggers)  # a token that may fire one
        # node, its position, the token that led to it, where each trigger's phrase starts (-1: not yet)
        stack: list[tuple[dict[int, Any], int, int, tuple[int, ...]]] = [(trie, 0, -1, unfired)]
        while stack:
            node, n, token, starts = stack.pop()
            if n:
                del written[n - 1:]
                written.append(token)
            forcing = [(j, n - start) for j, start in zip(triggers, starts)
                       if start >= 0 and n - start < len(entries[j].phrase_token_ids)] if starts != unfired else ()
            at = prefix.get(n)
            if at is None:  # what the entries do at position n: the same on every prefix of that length
                key = tuple(variant(entries[j], n) for j in fixed)  # and at every n where nothing changes
                at = made.get(key)
                if at is None:
                    at = made[key] = (*_before_choice([(j, entries[j]) for j in before if j not in phrases], n, sets),
                                      [(j, *mask_or_keep(entries[j], n, sets, j)) for j in after if j not in phrases])
                prefix[n] = at
            allowed, masked, origin, later = at
            for j in before_phrases:  # as _before_choice: a mask takes from an earlier allowed set
                mask = _phrase_masks(phrases[j], written)
                if allowed is None:
                    masked = masked | mask
                elif mask & allowed:
                    allowed, origin = allowed - mask, None  # no longer one entry's doing
            if len(node) == 1 and -1 not in node and not forcing:  # one next token (most of a long choice)
                (t,) = node
                ok = t not in masked if allowed is None else t in allowed
                for _, mask, only in later:
                    if not ok:
                        break
                    ok = (not mask or t not in mask) and (only is None or t in only)
                for j in after_phrases:
                    ok = ok and t not in _phrase_masks(phrases[j], written)
                if ok:
                    stack.append((node[t], n + 1, t, _fired(entries, triggers, starts, written, t) if t in cue_ends else starts))
                    continue
            ends = -1 in node
            eos = frozenset((choice.eos_token_id,)) if ends and choice.eos_token_id is not None else frozenset()
            keep = frozenset(t for t in node if t != -1) | eos
            left = keep - masked if allowed is None else keep & allowed
            why = None
            if not left:
                what = (f"the next tokens of its choices after {_output(written)}" if not ends else
                        f"EOS after the whole choice {_output(written)}" if len(node) == 1 else
                        f"EOS and the next tokens of its longer choices after the whole choice {_output(written)}")
                why = f"allows only {what}, which " + ("earlier entries mask" if origin is None else f"{paths[origin]} does not allow")
                blame = i
            else:
                for j, mask, only in sorted([*later, *((j, _phrase_masks(phrases[j], written), None) for j in after_phrases)]):
                    rest = (left - mask if mask else left) if only is None else left & only
                    if not rest:
                        why = ("masks every token" if only is None else "allows none of the tokens") + (
                            f" {paths[i]} leaves allowed after the output {_output(written)}")
                        blame = j
                        break
                    left = rest
            for by, k in forcing if why is None else ():  # a trigger's phrase: one token, after every entry
                forced = entries[by].phrase_token_ids[k]
                if forced in left:
                    left = frozenset((forced,))
                    continue
                if ends and not eos and forced not in keep:
                    left = frozenset()
                    break  # it may be the request's stop token, which ends the choice: not known here
                culprit, verb = _excluding(entries, i, (*before, *after), n, sets, phrases, written, forced, keep)
                cued = (f"once its trigger is written at {scale} positions {n - k - len(entries[by].trigger_token_ids)}"
                        f"..{n - k - 1}")
                there = f"after the output {_output(written)}" if culprit == i else f"at {scale} position {n}"
                if by > culprit:
                    why = f"forces token {forced} (phrase_token_ids[{k}]) {there} {cued}, which {paths[culprit]} {verb}"
                else:
                    why = f"{verb} token {forced} {there}, which {paths[by]} forces (its phrase_token_ids[{k}]) {cued}"
                yield Problem(paths[max(by, culprit)], f"contradicts the entries before it: it {why}; "
                                                      "the row would have no token left")
                return
            if why is not None:
                if ends and not eos:
                    continue  # a whole choice, its EOS the request's stop token: not known here
                yield Problem(paths[blame], f"contradicts the entries before it: it {why} at {scale} position {n}; "
                                            "the row would have no token left")
                return
            stack.extend((node[t], n + 1, t, _fired(entries, triggers, starts, written, t) if t in cue_ends else starts)
                         for t in node if t != -1 and t in left)


def _follows_trigger(entry: Any, scope: str) -> bool:
    """Whether the walk of a choice of ``scope`` follows this entry as a trigger: one with ids of the
    same scope (it reads the same stretch of output, whose every token the choices fix)."""
    return entry.kind == "trigger" and scope_of(entry) == scope and \
        entry.trigger_token_ids is not None and entry.phrase_token_ids is not None


def _fired(entries: Sequence[Any], triggers: Sequence[int], starts: tuple[int, ...], written: Sequence[int],
           token: int) -> tuple[int, ...]:
    """Where each trigger's phrase starts once ``token`` follows ``written`` (its first occurrence)."""
    n = len(written) + 1
    made = []
    for j, start in zip(triggers, starts):
        cue = entries[j].trigger_token_ids
        if start < 0 and n >= len(cue) and cue[-1] == token and tuple(written[n - len(cue):]) == cue[:-1]:
            start = n
        made.append(start)
    return tuple(made)


def _excluding(entries: Sequence[Any], i: int, others: Sequence[int], n: int, sets: dict[int, frozenset[int]],
               phrases: dict[int, dict[int, Any]], written: Sequence[int], token: int,
               keep: frozenset[int]) -> tuple[int, str]:
    """The first entry that leaves ``token`` out at position ``n`` after ``written`` (choice ``i``
    when its choices do not go on with it) and its verb."""
    if token not in keep:
        return i, "does not allow"
    for j in sorted(others):
        if j in phrases:
            if token in _phrase_masks(phrases[j], written):
                return j, "masks"
            continue
        mask, only = mask_or_keep(entries[j], n, sets, j)
        if mask and token in mask:
            return j, "masks"
        if only is not None and token not in only:
            return j, "does not allow"
    return i, "does not allow"


def trigger_problems(entries: Sequence[Any], paths: Sequence[str]) -> Iterator[Problem]:
    """A ``trigger`` whose phrase a position-free mask of its scale masks (``banned_tokens``,
    ``allowed_tokens``, a ``banned_phrases`` that trigger and phrase write): once the trigger is
    written the phrase is forced, so that token's row has none left; so is a phrase stop id a
    ``min_tokens`` of its scope holds (``_held_stop_problem``). A trigger those masks never let the
    output write never fires and is not followed. Beside a choice of its scope a trigger is left to
    the choice's walk (``choice_problems``), which follows it exactly."""
    walked = {scope_of(e) for e in entries if e.kind == "multiple_choice" and e.choices}
    for i, trigger in enumerate(entries):
        if trigger.kind != "trigger" or trigger.trigger_token_ids is None or trigger.phrase_token_ids is None:
            continue
        if scope_of(trigger) in walked:
            continue  # a choice of its scope fixes where it can be written: its walk follows the trigger
        forced = _forced_trigger_problem(entries, paths, i)
        if forced is not None:
            yield forced
            return
        scope = scope_of(trigger)
        masks = [j for j, e in enumerate(entries)
                 if j != i and e.kind in ("banned_tokens", "allowed_tokens", "banned_phrases") and on_scale(e, scope)]
        sets = {j: _phrase_trie(entries[j]) if entries[j].kind == "banned_phrases" else
                frozenset(entries[j].token_ids) if entries[j].kind == "banned_tokens" else keep_set(entries[j])
                for j in masks}

        def masking(written: Sequence[int], token: int) -> int | None:
            for j in masks:
                kind, held = entries[j].kind, sets[j]
                if (token not in held if kind == "allowed_tokens" else
                        token in (_phrase_masks(held, written) if kind == "banned_phrases" else held)):
                    return j
            return None

        written = list(trigger.trigger_token_ids)
        if any(masking(written[:k], t) is not None for k, t in enumerate(written)):
            continue  # never written: never fires
        held = _held_stop_problem(entries, paths, i)
        if held is not None:
            yield held
            return
        for k, token in enumerate(trigger.phrase_token_ids):
            j = masking(written, token)
            if j is not None:
                verb = "does not allow" if entries[j].kind == "allowed_tokens" else "masks"
                if j > i:
                    why = f"{verb} token {token}, which {paths[i]} forces (its phrase_token_ids[{k}]) once its trigger is written"
                else:
                    why = f"forces token {token} (phrase_token_ids[{k}]) once its trigger is written, which {paths[j]} {verb}"
                yield Problem(paths[max(i, j)], f"contradicts the entries before it: it {why}; the row would have no token left")
                return
            written.append(token)


def _held_stop_problem(entries: Sequence[Any], paths: Sequence[str], i: int) -> Problem | None:
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
    stops = {j: frozenset(entries[j].stop_token_ids) for j in held}
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


def _forced_trigger_problem(entries: Sequence[Any], paths: Sequence[str], i: int) -> Problem | None:
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
        end = next((e for e in range(len(cue), len(written)) if written[e - len(cue):e] == cue), None)
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


def _before_choice(entries: Sequence[tuple[int, Any]], n: int, sets: dict[int, frozenset[int]]
                   ) -> tuple[frozenset[int] | None, frozenset[int], int | None]:
    """``(allowed, masked, origin)`` after ``entries`` (index, entry) at position ``n``: the ids left
    (``None``: every id but ``masked``) and the entry that last restricted them."""
    allowed: frozenset[int] | None = None
    masked: frozenset[int] = frozenset()
    origin = None
    for j, entry in entries:
        mask, only = mask_or_keep(entry, n, sets, j)
        if mask:
            if allowed is None:
                masked |= mask
            else:
                allowed -= mask
        if only is not None:
            allowed = only - masked if allowed is None else only & allowed
            origin = j
    return allowed, masked, origin
