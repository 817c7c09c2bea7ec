"""``scope``: an entry that applies in one phase of a request only (``docs/specs.md``, "scope").

With reasoning delimiters in force (a ``reasoning`` entry, or the deployment's), every step of a
request is in its *reasoning* phase (inside a span the delimiters open, the prompt's included) or
its *answer* phase; without them every step is an answer step. An entry scoped to a phase acts
only at that phase's steps, and sees as its history the tokens generated since the current stretch
of that phase began (a forced sequence scoped to ``answer`` starts at the answer's first token).

``Phases`` follows one request (one ``SpanScanner``, shared by its scoped entries); ``scoped``
wraps a processor. A scoped processor has no template: its request runs on the hosted path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import torch

from .spans import SpanScanner

__all__ = ["Phases", "Reasoning", "scoped"]

#: A request's reasoning delimiters: ``(start token ids, end token ids)``.
Reasoning = tuple[tuple[int, ...], tuple[int, ...]]


class Phases:
    """Which phase each step of one request is in, and where that phase's stretch began."""

    __slots__ = ("_scanner",)

    def __init__(self, reasoning: Reasoning | None, prompt: Sequence[int] = ()) -> None:
        self._scanner = None if reasoning is None else SpanScanner(reasoning[0], reasoning[1], prompt)

    def at(self, generated: Sequence[int]) -> tuple[str, int]:
        """``(phase, began)`` of the step after ``generated``: ``"reasoning"`` or ``"answer"``, and the
        generated position where its stretch began (``0`` at most: a span the prompt opened)."""
        if self._scanner is None:
            return "answer", 0
        open_, began = self._scanner.segment(generated)
        return ("reasoning" if open_ else "answer"), max(began, 0)


class _Since(Sequence[int]):
    """``history[begin:]`` without a copy (a scoped entry's own history)."""

    __slots__ = ("_history", "_begin")

    def __init__(self, history: Sequence[int], begin: int) -> None:
        self._history, self._begin = history, begin

    def __len__(self) -> int:
        return max(0, len(self._history) - self._begin)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self._history[self._begin + start : self._begin + stop : step]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._history[self._begin + index]

    def __iter__(self) -> Iterator[int]:
        for i in range(self._begin, len(self._history)):
            yield self._history[i]


def _own(history: Sequence[int], began: int) -> Sequence[int]:
    return history if began == 0 else _Since(history, began)


class _Scoped:
    __slots__ = ("inner", "scope", "phases")

    def __init__(self, inner: Any, scope: str, phases: Phases) -> None:
        self.inner, self.scope, self.phases = inner, scope, phases

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        phase, began = self.phases.at(input_ids)
        if phase == self.scope:
            self.inner(_own(input_ids, began), logits)

    def __repr__(self) -> str:
        return f"{type(self.inner).__name__}[scope={self.scope}]"


class _ScopedPlanned(_Scoped):
    """A scoped processor whose step is a ``RowOp`` (the host path batches it)."""

    __slots__ = ()

    def row_op(self, input_ids: Sequence[int]) -> Any:
        phase, began = self.phases.at(input_ids)
        return self.inner.row_op(_own(input_ids, began)) if phase == self.scope else None


def scoped(processor: Any, scope: str, phases: Phases) -> Any:
    """``processor`` applied only at ``scope``'s steps (``"always"``: ``processor`` itself)."""
    if scope == "always":
        return processor
    return _ScopedPlanned(processor, scope, phases) if hasattr(processor, "row_op") else _Scoped(processor, scope, phases)
