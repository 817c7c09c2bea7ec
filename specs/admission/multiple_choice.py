"""``multiple_choice`` for admission: at its first position it keeps exactly its choices' first
tokens; past it the walk follows its choices' trie (the next tokens of the choices a prefix
begins, and EOS after a whole choice when it names one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .rules import Along, KindRules

__all__ = ["RULES"]


class MultipleChoiceEntry(Protocol):
    """What admission reads of a ``multiple_choice`` (id choices)."""

    @property
    def choices(self) -> Sequence[Sequence[int]]: ...
    @property
    def eos_token_id(self) -> int | None: ...


def _ids(entry: MultipleChoiceEntry) -> frozenset[int]:
    return frozenset(choice[0] for choice in entry.choices)


def _along(entry: MultipleChoiceEntry) -> Along:
    return Along(first=True)


def _choices(entry: MultipleChoiceEntry) -> Sequence[Sequence[int]]:
    return entry.choices


def _eos(entry: MultipleChoiceEntry) -> int | None:
    return entry.eos_token_id


def _size(entry: MultipleChoiceEntry) -> int:
    return len(entry.choices)


RULES: KindRules[MultipleChoiceEntry] = KindRules(
    form="first", ids=_ids, along=_along, keep_words="its choices' first tokens, which", choices=_choices,
    choice_eos=_eos, contradicts=True, size=_size, field="choices")
