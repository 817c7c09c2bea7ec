"""``min_tokens``: suppress the stop tokens until enough tokens were generated."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictInt

from ..entry_base import EntryModel, TokenIds
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "MinTokens", "MinTokensSpec"]


class MinTokensSpec(EntryModel):
    """Suppress ``stop_token_ids`` until ``min_tokens`` tokens have been generated."""

    kind: Literal["min_tokens"] = "min_tokens"
    min_tokens: Annotated[StrictInt, Field(ge=1)]
    stop_token_ids: TokenIds


class MinTokens(FastModel, tag="min_tokens", frozen=True):
    min_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_token_ids: FastTokenIds


KIND = ProcessorKind(
    kind="min_tokens", spec_model=MinTokensSpec, fast_model=MinTokens, builtin=True,
    factory="dynlogits.processors.min_tokens:factory",
    admission="dynlogits.specs.admission.min_tokens:RULES",
)
