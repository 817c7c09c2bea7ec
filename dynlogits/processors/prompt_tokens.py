"""``prompt_tokens``: boost the request's own prompt tokens, or restrict the output to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .allowed_tokens import AllowedTokensProcessor
from .base import RealizeContext
from .logit_bias import LogitBiasProcessor

__all__ = ["KIND", "factory", "prompt_token_set"]

KIND = "prompt_tokens"


def prompt_token_set(prompt: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """The distinct ids of ``prompt`` inside the logits width, sorted."""
    return tuple(sorted({t for t in prompt if 0 <= t < vocab_size}))


def factory(entry: Any, ctx: RealizeContext) -> Any:
    """``boost``: a ``logit_bias`` of ``boost`` on every prompt token; ``restrict``: an
    ``allowed_tokens`` of the prompt's tokens and the request's stop tokens. Both are built-in
    processors, so such a request stays on the resident path."""
    if not ctx.prompt_ids:
        raise ValueError("prompt_tokens needs the request's prompt, which this engine did not give")
    ids = prompt_token_set(ctx.prompt_ids, ctx.vocab_size)
    if entry.mode == "boost":
        return LogitBiasProcessor({i: float(entry.boost) for i in ids})
    stops = [t for t in ctx.stop_token_ids if 0 <= t < ctx.vocab_size]
    return AllowedTokensProcessor([*ids, *stops[1:]], stops[0] if stops else None)
