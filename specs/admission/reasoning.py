"""``reasoning`` for admission: it declares the request's reasoning delimiters, which split the
output into the reasoning and answer phases; it acts on no row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Delimiters, KindRules

__all__ = ["RULES"]


class ReasoningEntry(Protocol):
    """What admission reads of a ``reasoning``."""

    @property
    def start_token_ids(self) -> Sequence[int]: ...
    @property
    def end_token_ids(self) -> Sequence[int]: ...


def _delimiters(entry: ReasoningEntry) -> Delimiters:
    return tuple(entry.start_token_ids), tuple(entry.end_token_ids)


RULES: KindRules[ReasoningEntry] = KindRules(
    delimiters=_delimiters, acts=False, id_fields=("start_token_ids", "end_token_ids"))
