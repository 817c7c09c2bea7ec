"""``allowed_tokens``: only ``token_ids`` (and ``eos_token_id``) may be sampled."""

from __future__ import annotations

from typing import Literal, Union

from ..entry_base import EntryModel, TokenId, TokenIds
from ..fast_base import FastModel
from ..fast_base import TokenId as FastTokenId
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "AllowedTokens", "AllowedTokensSpec"]


class AllowedTokensSpec(EntryModel):
    """Only ``token_ids`` (plus ``eos_token_id`` when given) may be sampled."""

    kind: Literal["allowed_tokens"] = "allowed_tokens"
    token_ids: TokenIds
    eos_token_id: TokenId | None = None


class AllowedTokens(FastModel, tag="allowed_tokens", frozen=True):
    token_ids: FastTokenIds
    eos_token_id: Union[FastTokenId, None] = None


KIND = ProcessorKind(
    kind="allowed_tokens", spec_model=AllowedTokensSpec, fast_model=AllowedTokens, builtin=True,
    factory="dynlogits.processors.allowed_tokens:factory",
    admission="dynlogits.specs.admission.allowed_tokens:RULES",
)
