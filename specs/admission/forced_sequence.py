"""``forced_sequence`` for admission: it forces its tokens one per position of its scale, then its
EOS, so it keeps one token at each position and fixes the output of its stretch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Along, KindRules

__all__ = ["RULES"]


class ForcedSequenceEntry(Protocol):
    """What admission reads of a ``forced_sequence``."""

    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def eos_token_id(self) -> int: ...


def _along(entry: ForcedSequenceEntry) -> Along:
    return Along(sequence=tuple(entry.token_ids), after=entry.eos_token_id)


def _writes(entry: ForcedSequenceEntry) -> tuple[int, ...]:
    return (*entry.token_ids, entry.eos_token_id)


RULES: KindRules[ForcedSequenceEntry] = KindRules(
    form="force", along=_along, writes=_writes, contradicts=True, field="token_ids", id_fields=("token_ids",))
