"""The kinds' processors, imported by the engine only (first realization of an entry of the kind)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynlogits.processors.banned_tokens import BannedTokensTemplate
from dynlogits.processors.base import IndexCache, RealizeContext
from dynlogits.processors.ops import MaskIds, RowOp, apply_op

from .kinds import BanRangeSpec, NoRepeatNgramSpec

__all__ = ["BanRange", "NoRepeatNgram", "make_ban_range", "make_no_repeat_ngram"]


class BanRange:
    """Masks ``[start, stop)`` at every step.

    The same at every step, so it describes itself as data: ``template`` (a built-in kind's
    ``Template``, here ``banned_tokens``') lets a slot engine keep it on the device (resident), and
    ``row_op`` lets the other engines batch it with every row's ops. ``__call__`` is the reference
    both must equal."""

    __slots__ = ("_op", "template")

    def __init__(self, start: int, stop: int) -> None:
        ids = tuple(range(start, stop))
        self.template = BannedTokensTemplate(ids)
        self._op = MaskIds(IndexCache(ids))

    def row_op(self, generated_ids: Sequence[int]) -> RowOp:
        return self._op

    def __call__(self, generated_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self._op, logits)


class NoRepeatNgram:
    """Bans each token that would complete an ``n``-gram already in the generated tokens.

    Its step depends on the tokens, so it has no template: it runs per row (hosted), after the
    request's resident entries. Stateless: one instance serves every row of its request (samples,
    beams, draft rows), each with its own history. A negative id is a placeholder (vLLM's ``-1``
    for a token not yet known): an ``n``-gram holding one is skipped, never used as an index."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def row_op(self, generated_ids: Sequence[int]) -> RowOp | None:
        tokens, n = list(generated_ids), self.n
        if len(tokens) < n:
            return None
        prefix = tokens[len(tokens) - n + 1:] if n > 1 else []
        if any(t < 0 for t in prefix):
            return None
        banned = {tokens[i + n - 1] for i in range(len(tokens) - n + 1)
                  if tokens[i:i + n - 1] == prefix and tokens[i + n - 1] >= 0}
        return MaskIds(IndexCache(sorted(banned))) if banned else None

    def __call__(self, generated_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(generated_ids), logits)


def make_ban_range(entry: BanRangeSpec, ctx: RealizeContext) -> BanRange:
    """One request's ``BanRange`` (``stop`` clipped to the logits width; ``start`` is below it:
    admission checked it as an id)."""
    return BanRange(entry.start, min(entry.stop, ctx.vocab_size))


def make_no_repeat_ngram(entry: NoRepeatNgramSpec, ctx: RealizeContext) -> NoRepeatNgram:
    """One request's ``NoRepeatNgram``."""
    return NoRepeatNgram(entry.n)
