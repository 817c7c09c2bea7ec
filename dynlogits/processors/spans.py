"""Spans a token sequence opens and closes with delimiter sequences, followed from the prompt on.

A span opens right after the tokens end with ``start`` and closes right after ``end`` follows
inside it (``docs/specs.md``, "reasoning"). ``SpanScanner.segment(generated)`` says whether a span is
open after the tokens generated so far and where the current stretch began, in generated-token
positions: the open span's start (``0``: at the first generated token; negative: inside the prompt,
which left it open), or, outside any span, right after the last span closed (``0`` when none closed
since generation began). A delimiter may straddle the prompt's end. Incremental: each call scans only the tokens it has not seen; a history whose tail changed
(rejected drafts, a replaced placeholder) rolls back to the last agreeing position within
``ROLLBACK``; a change further back rescans from the start.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PLACEHOLDER", "ROLLBACK", "SpanScanner", "prompt_span"]

#: Placeholder id some engines put in a history before the sampled token is known (vLLM's async
#: scheduling): never matched, and scanning stops before it until it is replaced.
PLACEHOLDER = -1
#: How far back a history may change between calls and still be followed without a rescan.
ROLLBACK = 64


def prompt_span(prompt: Sequence[int], start: tuple[int, ...], end: tuple[int, ...]) -> int | None:
    """Where a span the prompt leaves open began, in generated-token positions (``<= 0``), or ``None``.

    One pass over the prompt that compares sequences only where a delimiter's last token sits."""
    span: int | None = None
    start_last, end_last = start[-1], end[-1]
    for upto, token in enumerate(prompt, 1):
        if span is None:
            if token == start_last and upto >= len(start) and tuple(prompt[upto - len(start) : upto]) == start:
                span = upto
        elif token == end_last and upto - span >= len(end) and tuple(prompt[upto - len(end) : upto]) == end:
            span = None
    return None if span is None else span - len(prompt)


class SpanScanner:
    """The open span after a request's prompt and generated tokens (see the module doc)."""

    __slots__ = ("start", "end", "_window", "_tail", "_initial", "_tokens", "_states", "_base")

    #: a state: the open span's start (``None``: none open) and where the stretch outside spans began

    def __init__(self, start: Sequence[int], end: Sequence[int], prompt: Sequence[int] = ()) -> None:
        if not start or not end:
            raise ValueError("span delimiters must be non-empty token sequences")
        self.start, self.end = tuple(start), tuple(end)
        self._window = max(len(self.start), len(self.end))
        self._tail = tuple(prompt[max(0, len(prompt) - self._window + 1) :])  # for delimiters that straddle it
        self._initial = prompt_span(prompt, self.start, self.end)
        self._reset()

    def _reset(self) -> None:
        self._base = 0  # history position of self._tokens[0] / self._states[0]
        self._tokens: list[int] = []  # the scanned tokens from position _base on
        self._states: list[tuple[int | None, int]] = [(self._initial, 0)]  # after each scanned prefix

    @property
    def prompt_tail(self) -> int:
        """How many of the prompt's last tokens a delimiter may cover (the prompt's length, up to
        one token less than the longer delimiter)."""
        return len(self._tail)

    @property
    def initial(self) -> int | None:
        """Where the span the prompt left open began (generated positions, ``<= 0``); ``None``: none."""
        return self._initial

    def recent(self, ids: Sequence[int], k: int) -> tuple[int, ...]:
        """The last ``k`` tokens of the prompt followed by ``ids`` (``k`` below the longer delimiter's length)."""
        if k <= len(ids):
            return tuple(ids[len(ids) - k :])
        return self._tail[max(0, len(self._tail) - (k - len(ids))) :] + tuple(ids)

    @property
    def _scanned(self) -> int:
        return self._base + len(self._tokens)

    def _ends_with(self, ids: Sequence[int], upto: int, seq: tuple[int, ...]) -> bool:
        if upto >= len(seq):
            return tuple(ids[upto - len(seq) : upto]) == seq
        before = len(seq) - upto  # the rest lies in the prompt's tail
        return len(self._tail) >= before and self._tail[len(self._tail) - before :] + tuple(ids[:upto]) == seq

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

    def segment(self, ids: Sequence[int]) -> tuple[bool, int]:
        """``(open, began)`` after ``ids`` (see the module doc)."""
        span, outside = self._scan(ids)
        return (True, span) if span is not None else (False, outside)

    def span(self, ids: Sequence[int]) -> int | None:
        """Where the open span began after ``ids`` (generated positions; ``None``: none is open)."""
        return self._scan(ids)[0]

    def _scan(self, ids: Sequence[int]) -> tuple[int | None, int]:
        agree = self._agree(ids)
        if agree < self._base:  # changed before the kept tail: start over (rare)
            self._reset()
            agree = 0
        keep = agree - self._base
        del self._tokens[keep:]
        del self._states[keep + 1 :]
        span, outside = self._states[-1]
        for upto in range(agree + 1, len(ids) + 1):
            token = ids[upto - 1]
            if token == PLACEHOLDER:
                break  # not known yet: state stays at the last known token
            if span is None:
                if self._ends_with(ids, upto, self.start):
                    span = upto
            elif upto - span >= len(self.end) and self._ends_with(ids, upto, self.end):
                span, outside = None, upto
            self._tokens.append(token)
            self._states.append((span, outside))
        overflow = len(self._tokens) - (ROLLBACK + self._window)
        if overflow > 0:
            self._base += overflow
            del self._tokens[:overflow]
            del self._states[:overflow]
        return span, outside
