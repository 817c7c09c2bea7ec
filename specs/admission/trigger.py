"""``trigger`` for admission: once the output of its stretch first ends with its trigger ids, it
forces its phrase; where the trigger is written is known only where other entries fix the output
(a forced sequence, a choice), so the walks follow it there and against the masks of its scale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import KindRules

__all__ = ["RULES"]


class TriggerEntry(Protocol):
    """What admission reads of a ``trigger`` (id trigger and phrase)."""

    @property
    def trigger_token_ids(self) -> Sequence[int] | None: ...
    @property
    def phrase_token_ids(self) -> Sequence[int] | None: ...


def _cue(entry: TriggerEntry) -> tuple[Sequence[int], Sequence[int]] | None:
    if entry.trigger_token_ids is None or entry.phrase_token_ids is None:
        return None
    return entry.trigger_token_ids, entry.phrase_token_ids


RULES: KindRules[TriggerEntry] = KindRules(
    cue=_cue, contradicts=True, field="trigger_token_ids", id_fields=("trigger_token_ids", "phrase_token_ids"))
