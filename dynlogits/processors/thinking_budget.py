"""``thinking_budget``: close a thinking span once it has used its token budget."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ops import ForceToken, RowOp, apply_op

__all__ = ["ThinkingBudgetProcessor"]


class ThinkingBudgetProcessor:
    """Force ``end_token_ids`` once ``budget`` tokens follow ``start_token_ids`` in an open span.

    A span opens right after the generated tokens contain ``start_token_ids`` and
    closes when ``end_token_ids`` follows. When the span holds ``budget`` or more
    tokens, the next end token is forced each step — continuing an end sequence
    the model already began — until the span closes; then the model is free, and
    a later start sequence opens a new span with a fresh budget.

    The span state is derived from the token history; the scan is incremental
    (O(new tokens) per step) and restarts from scratch whenever the history got
    shorter or the last scanned tokens changed (preemption, recomputation, a
    placeholder id replaced under async scheduling).
    """

    __slots__ = ("start", "end", "budget", "_window", "_scanned", "_tail", "_span_start")

    def __init__(self, start_token_ids: Sequence[int], end_token_ids: Sequence[int], budget: int) -> None:
        self.start = tuple(start_token_ids)
        self.end = tuple(end_token_ids)
        self.budget = budget
        self._window = max(len(self.start), len(self.end))
        self._reset()

    def _reset(self) -> None:
        self._scanned = 0
        self._tail: tuple[int, ...] = ()
        self._span_start: int | None = None  # index of the first token inside the open span

    @staticmethod
    def _ends_with(ids: Sequence[int], upto: int, seq: tuple[int, ...]) -> bool:
        return upto >= len(seq) and tuple(ids[upto - len(seq) : upto]) == seq

    def _scan(self, ids: Sequence[int]) -> None:
        n = len(ids)
        if n < self._scanned or tuple(ids[self._scanned - len(self._tail) : self._scanned]) != self._tail:
            self._reset()
        for upto in range(self._scanned + 1, n + 1):
            if self._span_start is None:
                if self._ends_with(ids, upto, self.start):
                    self._span_start = upto
            elif upto - self._span_start >= len(self.end) and self._ends_with(ids, upto, self.end):
                self._span_start = None
        self._scanned = n
        self._tail = tuple(ids[max(0, n - self._window) : n])

    def _end_progress(self, ids: Sequence[int], span_len: int) -> int:
        """How many leading end tokens the span already ends with."""
        for k in range(min(len(self.end) - 1, span_len), 0, -1):
            if tuple(ids[len(ids) - k :]) == self.end[:k]:
                return k
        return 0

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        self._scan(input_ids)
        if self._span_start is None:
            return None
        span_len = len(input_ids) - self._span_start
        if span_len < self.budget:
            return None
        return ForceToken(self.end[self._end_progress(input_ids, span_len)])

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
