"""``allowed_tokens`` for admission: it keeps only its ids and its EOS at every position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Anywhere, KindRules, Meeting, Sets

__all__ = ["RULES"]


class AllowedTokensEntry(Protocol):
    """What admission reads of an ``allowed_tokens``."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def eos_token_id(self) -> int | None: ...


def _ids(entry: AllowedTokensEntry) -> frozenset[int]:
    """Its ids and its EOS."""
    ids = set(entry.token_ids)
    if entry.eos_token_id is not None:
        ids.add(entry.eos_token_id)
    return frozenset(ids)


def _size(entry: AllowedTokensEntry) -> int:
    return len(entry.token_ids) + 1


def _meets(entry: AllowedTokensEntry, j: int, sets: Sets, forced: Anywhere, path: str) -> Meeting | None:
    keep = sets.keep(j)
    if forced.held <= keep:
        return None
    return Meeting(f"token {min(forced.held - keep)} is not allowed by {path}")


RULES: KindRules[AllowedTokensEntry] = KindRules(
    form="keep", ids=_ids, keep_words="tokens that", meets_anywhere=_meets, contradicts=True, size=_size,
    field="token_ids", id_fields=("token_ids",))
