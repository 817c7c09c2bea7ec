"""``prompt_tokens``: boost the request's own prompt tokens, or restrict the output to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from dynlogits.specs import AllowedTokensSpec
from dynlogits.specs.builtin.prompt_tokens import PromptTokens, PromptTokensSpec

from .allowed_tokens import AllowedTokensProcessor
from .base import RealizeContext
from .logit_bias import LogitBiasProcessor

__all__ = ["KIND", "factory", "prompt_token_set", "realized"]

#: what realization passes this kind's factory: the validated model or its fast decode
Entry: TypeAlias = PromptTokensSpec | PromptTokens

KIND = "prompt_tokens"


def prompt_token_set(prompt: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """The distinct ids of ``prompt`` inside the logits width, sorted."""
    ids = set(prompt)
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        ids = {t for t in ids if 0 <= t < vocab_size}
    return tuple(sorted(ids))


def realized(entry: Entry, ctx: RealizeContext) -> AllowedTokensSpec | None:
    """``restrict`` as the ``allowed_tokens`` it realizes to for this request (the prompt's distinct
    ids and the stop ids but the first, which is the set's EOS; same scope), ``None`` for ``boost``
    (it masks nothing) or without a prompt. The realizing worker checks it against the other entries."""
    if entry.mode != "restrict" or not ctx.prompt_ids:
        return None
    stops = [t for t in ctx.stop_token_ids if 0 <= t < ctx.vocab_size]
    return AllowedTokensSpec.model_construct(token_ids=[*prompt_token_set(ctx.prompt_ids, ctx.vocab_size), *stops[1:]],
                                             eos_token_id=stops[0] if stops else None, scope=entry.scope)


def factory(entry: Entry, ctx: RealizeContext) -> LogitBiasProcessor | AllowedTokensProcessor:
    """``boost``: a ``logit_bias`` of ``boost`` on every prompt token; ``restrict``: an
    ``allowed_tokens`` of the prompt's tokens and the request's stop tokens. Both are built-in
    processors, so such a request stays on the resident path."""
    if not ctx.prompt_ids:
        raise ValueError("prompt_tokens needs the request's prompt, which this engine did not give")
    if entry.mode == "boost":
        return LogitBiasProcessor({i: float(entry.boost) for i in prompt_token_set(ctx.prompt_ids, ctx.vocab_size)})
    allowed = realized(entry, ctx)
    assert allowed is not None
    return AllowedTokensProcessor(allowed.token_ids, allowed.eos_token_id)
