"""``min_tokens`` for admission: it masks its stop ids at the positions of its scale before
``min_tokens`` (alone, they may cover the vocabulary), end tokens forced anywhere included, since
a span may close before that."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Along, Anywhere, KindRules, Meeting, Sets

__all__ = ["RULES"]


class MinTokensEntry(Protocol):
    """What admission reads of a ``min_tokens``."""

    @property
    def min_tokens(self) -> int: ...
    @property
    def stop_token_ids(self) -> Sequence[int]: ...


def _ids(entry: MinTokensEntry) -> frozenset[int]:
    return frozenset(entry.stop_token_ids)


def _along(entry: MinTokensEntry) -> Along:
    return Along(below=entry.min_tokens)


def _size(entry: MinTokensEntry) -> int:
    return len(entry.stop_token_ids)


def _meets(entry: MinTokensEntry, j: int, sets: Sets, forced: Anywhere, path: str) -> Meeting | None:
    clash = forced.held & sets.mask(j)
    if not clash:
        return None
    return Meeting(f"token {min(clash)} is masked by {path} until output position {entry.min_tokens}", holds=True)


RULES: KindRules[MinTokensEntry] = KindRules(
    form="mask", ids=_ids, along=_along, meets_anywhere=_meets, alone=True, size=_size, field="stop_token_ids",
    id_fields=("stop_token_ids",))
