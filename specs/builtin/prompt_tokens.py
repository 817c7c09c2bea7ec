"""``prompt_tokens``: boost the request's own prompt tokens, or allow only them."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictFloat

from ..entry_base import EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind
from ..limits import MAX_ABS_LOGIT_BIAS

__all__ = ["KIND", "PromptTokens", "PromptTokensSpec"]


class PromptTokensSpec(EntryModel):
    """The request's own prompt tokens: ``boost`` adds ``boost`` to their logits; ``restrict``
    allows only them (and the request's stop tokens)."""

    kind: Literal["prompt_tokens"] = "prompt_tokens"
    mode: Literal["boost", "restrict"]
    boost: Annotated[StrictFloat, Field(gt=0, le=MAX_ABS_LOGIT_BIAS, allow_inf_nan=False)] = 2.0


class PromptTokens(FastModel, tag="prompt_tokens", frozen=True):
    mode: Literal["boost", "restrict"]
    boost: Annotated[float, msgspec.Meta(gt=0, le=MAX_ABS_LOGIT_BIAS)] = 2.0


KIND = ProcessorKind(
    kind="prompt_tokens", spec_model=PromptTokensSpec, fast_model=PromptTokens, builtin=True,
    factory="dynlogits.processors.prompt_tokens:factory",
    admission="dynlogits.specs.admission.prompt_tokens:RULES",
    reads_prompt=True,
)
