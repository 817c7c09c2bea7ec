"""``thinking_budget``: close a thinking span once it has used its token budget."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ops import ForceToken, RowOp, apply_op
from .templates import ThinkingTemplate

__all__ = ["ThinkingBudgetProcessor"]

#: Placeholder id some engines put in a history before the sampled token is known (vLLM's async
#: scheduling): never matched, and scanning stops before it until it is replaced.
PLACEHOLDER = -1
#: How far back a history may change between calls and still be followed without a rescan
#: (speculative drafts that were rejected, a placeholder replaced); beyond it, one full rescan.
ROLLBACK = 64


class ThinkingBudgetProcessor:
    """Force ``end_token_ids`` once ``budget`` tokens follow ``start_token_ids`` in an open span.

    A span opens right after the generated tokens contain ``start_token_ids`` and
    closes when ``end_token_ids`` follows. When the span holds ``budget`` or more
    tokens, the next end token is forced each step — continuing an end sequence
    the model already began — until the span closes; then the model is free, and
    a later start sequence opens a new span with a fresh budget.

    The span state is derived from the token history, incrementally: each call scans only the
    tokens it has not seen, and keeps the state at each of the last ``ROLLBACK`` positions with
    the tokens seen there. When the tail of a history differs from what was scanned (draft tokens
    rejected under speculative decoding, a placeholder replaced) the state rolls back to the last
    position that still agrees and rescans from there, so a step costs O(new tokens + the window),
    never O(history). Only a history that changed further back than ``ROLLBACK`` tokens (a
    different request's) is rescanned from the start.
    """

    __slots__ = ("start", "end", "budget", "template", "_window", "_tokens", "_states", "_base")

    def __init__(self, start_token_ids: Sequence[int], end_token_ids: Sequence[int], budget: int) -> None:
        self.start = tuple(start_token_ids)
        self.end = tuple(end_token_ids)
        self.budget = budget
        self.template = ThinkingTemplate(self.start, self.end, budget)
        self._window = max(len(self.start), len(self.end))
        self._reset()

    def _reset(self) -> None:
        self._base = 0  # history position of self._tokens[0] / self._states[0]
        self._tokens: list[int] = []  # the scanned tokens from position _base on
        self._states: list[int | None] = [None]  # span start (None: closed) after each scanned prefix

    @property
    def _scanned(self) -> int:
        return self._base + len(self._tokens)

    @staticmethod
    def _ends_with(ids: Sequence[int], upto: int, seq: tuple[int, ...]) -> bool:
        return upto >= len(seq) and tuple(ids[upto - len(seq) : upto]) == seq

    def _agree(self, ids: Sequence[int]) -> int:
        """How many leading tokens of ``ids`` agree with what was scanned (within the kept tail)."""
        n = min(len(ids), self._scanned)
        low = max(self._base, n - ROLLBACK)
        seen = self._tokens[low - self._base : n - self._base]
        if list(ids[low:n]) == seen:  # the common case, compared at C speed
            return n
        for pos in range(low, n):
            if ids[pos] != seen[pos - low]:
                return pos
        return n

    def _scan(self, ids: Sequence[int]) -> int | None:
        """The span start after scanning ``ids`` (``None``: no open span)."""
        agree = self._agree(ids)
        if agree < self._base:  # changed before the kept tail: start over (rare)
            self._reset()
            agree = 0
        keep = agree - self._base
        del self._tokens[keep:]
        del self._states[keep + 1 :]
        span = self._states[-1]
        for upto in range(agree + 1, len(ids) + 1):
            token = ids[upto - 1]
            if token == PLACEHOLDER:
                break  # not known yet: state stays at the last known token
            if span is None:
                if self._ends_with(ids, upto, self.start):
                    span = upto
            elif upto - span >= len(self.end) and self._ends_with(ids, upto, self.end):
                span = None
            self._tokens.append(token)
            self._states.append(span)
        overflow = len(self._tokens) - (ROLLBACK + self._window)
        if overflow > 0:
            self._base += overflow
            del self._tokens[:overflow]
            del self._states[:overflow]
        return span

    def _end_progress(self, ids: Sequence[int], span_len: int) -> int:
        """How many leading end tokens the span already ends with."""
        for k in range(min(len(self.end) - 1, span_len), 0, -1):
            if tuple(ids[len(ids) - k :]) == self.end[:k]:
                return k
        return 0

    def row_op(self, input_ids: Sequence[int]) -> RowOp | None:
        span = self._scan(input_ids)
        if span is None:
            return None
        span_len = len(input_ids) - span
        if span_len < self.budget:
            return None
        return ForceToken(self.end[self._end_progress(input_ids, span_len)])

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
