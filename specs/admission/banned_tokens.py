"""``banned_tokens`` for admission: it masks its ids at every position (alone, it may cover the
vocabulary), end tokens forced anywhere included."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Anywhere, KindRules, Meeting, Sets

__all__ = ["RULES"]


class BannedTokensEntry(Protocol):
    """What admission reads of a ``banned_tokens``."""

    @property
    def token_ids(self) -> Sequence[int]: ...


def _ids(entry: BannedTokensEntry) -> frozenset[int]:
    return frozenset(entry.token_ids)


def _size(entry: BannedTokensEntry) -> int:
    return len(entry.token_ids)


def _meets(entry: BannedTokensEntry, j: int, sets: Sets, forced: Anywhere, path: str) -> Meeting | None:
    mask = sets.mask(j)
    if forced.held.isdisjoint(mask):
        return None
    return Meeting(f"token {min(forced.held & mask)} is banned by {path}")


RULES: KindRules[BannedTokensEntry] = KindRules(
    form="mask", ids=_ids, meets_anywhere=_meets, alone=True, size=_size, field="token_ids", id_fields=("token_ids",))
