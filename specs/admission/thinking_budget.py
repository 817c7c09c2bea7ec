"""``thinking_budget`` for admission: it forces its end tokens wherever its span closes, which may
be after any number of tokens (a span the prompt opened counts its tokens), so every entry acting
where the span can close meets them. It needs delimiters, its own or the request's; on the
request's, it cannot be scoped to ``answer``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import Problem
from .rules import Anywhere, Delimiters, KindRules

__all__ = ["RULES"]


class ThinkingBudgetEntry(Protocol):
    """What admission reads of a ``thinking_budget``."""

    @property
    def start_token_ids(self) -> Sequence[int] | None: ...
    @property
    def end_token_ids(self) -> Sequence[int] | None: ...
    @property
    def scope(self) -> str: ...


def _delimiters(entry: ThinkingBudgetEntry, reasoning: Delimiters | None) -> Delimiters:
    """Its delimiters: its own, else the request's (``()`` where neither is known)."""
    start = tuple(entry.start_token_ids) if entry.start_token_ids is not None else reasoning[0] if reasoning else ()
    end = tuple(entry.end_token_ids) if entry.end_token_ids is not None else reasoning[1] if reasoning else ()
    return start, end


def _anywhere(entry: ThinkingBudgetEntry, reasoning: Delimiters | None, phases: frozenset[str]) -> Anywhere:
    """Its end tokens, forced where its span is open: in its phases, only in reasoning on the
    request's delimiters."""
    start, end = _delimiters(entry, reasoning)
    closes = phases & {"reasoning"} if (start, end) == reasoning else phases
    return Anywhere(end, closes, "the end tokens",
                    so=", so closing a thinking span would leave the row with no token",
                    until=", and the span can be closed before that (a span the prompt opened counts its tokens), "
                          "which would leave the row with no token")


def _no_delimiters(entry: ThinkingBudgetEntry, path: str, reasoning: Delimiters | None) -> Problem | None:
    if reasoning is not None or (entry.start_token_ids is not None and entry.end_token_ids is not None):
        return None
    return Problem(path, "thinking_budget has no delimiters of its own (start/end) and the payload declares "
                         "no reasoning delimiters (a reasoning entry, or the deployment's reasoning:)")


def _answer_on_reasoning(entry: ThinkingBudgetEntry, path: str, reasoning: Delimiters | None) -> Problem | None:
    """Scoped to ``answer`` on the request's reasoning delimiters: the reasoning span is never open
    in the answer, yet the scoped processor reads the prompt and the answer's stretch, so where the
    prompt opened a span it counts it as open and forces the end token into the answer (and
    otherwise does nothing). Refused: it can only do harm."""
    if reasoning is None or getattr(entry, "scope", "always") != "answer" or _delimiters(entry, reasoning) != reasoning:
        return None
    return Problem(f"{path}.scope", "a thinking_budget on the reasoning delimiters cannot be scoped to answer: "
                                    "the reasoning span is never open in the answer, yet a span the prompt "
                                    "opened would be counted there and its end token forced into the answer; "
                                    "scope it reasoning or always")


RULES: KindRules[ThinkingBudgetEntry] = KindRules(
    anywhere=_anywhere, alone=True, contradicts=True, checks=(_no_delimiters, _answer_on_reasoning),
    field="end_token_ids", id_fields=("start_token_ids", "end_token_ids"))
