"""``banned_phrases`` for admission: wherever the output of its stretch ends with all but the last
token of one of its phrases, it masks that last token (a one-token phrase always), so it meets
every output a walk follows: a sequence forced in its stretch, end tokens forced anywhere, a
choice's prefixes, a trigger and its phrase."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Anywhere, KindRules, Meeting, Sets

__all__ = ["RULES"]


class BannedPhrasesEntry(Protocol):
    """What admission reads of a ``banned_phrases``."""

    @property
    def phrases(self) -> Sequence[Sequence[int]]: ...


def _phrases(entry: BannedPhrasesEntry) -> Sequence[Sequence[int]]:
    return entry.phrases


def _meets(entry: BannedPhrasesEntry, j: int, sets: Sets, forced: Anywhere, path: str) -> Meeting | None:
    """Forced tokens that hold a phrase: where they are written its last token is masked."""
    k = sets.automaton(j).first_in(forced.tokens)
    if k is None:
        return None
    phrase = entry.phrases[k]
    if len(phrase) == 1:
        return Meeting(f"token {phrase[0]} is banned by {path}.phrases[{k}] (a one-token phrase)")
    return Meeting(f"{forced.noun} hold {path}.phrases[{k}], whose last token {phrase[-1]} the ban masks once the rest is written")


RULES: KindRules[BannedPhrasesEntry] = KindRules(phrases=_phrases, meets_anywhere=_meets, field="phrases")
