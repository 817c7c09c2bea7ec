"""What an entry does to a step's row, as admission models it (``consistency``,
``consistency_walks``): the ids it masks or keeps at an output position, what of the position
that depends on, and which entries meet at one position scale. Wire entries in, no torch."""

from __future__ import annotations

from typing import Any

__all__ = ["forced_token", "keep_set", "mask_or_keep", "on_scale", "scope_of", "variant"]


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
