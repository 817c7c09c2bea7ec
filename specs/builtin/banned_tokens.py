"""``banned_tokens``: ``token_ids`` are never sampled."""

from __future__ import annotations

from typing import Literal

from ..entry_base import EntryModel, TokenIds
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "BannedTokens", "BannedTokensSpec"]


class BannedTokensSpec(EntryModel):
    """``token_ids`` are never sampled (their logits are set to -inf every step)."""

    kind: Literal["banned_tokens"] = "banned_tokens"
    token_ids: TokenIds


class BannedTokens(FastModel, tag="banned_tokens", frozen=True):
    token_ids: FastTokenIds


KIND = ProcessorKind(
    kind="banned_tokens", spec_model=BannedTokensSpec, fast_model=BannedTokens, builtin=True,
    factory="dynlogits.processors.banned_tokens:factory",
    admission="dynlogits.specs.admission.banned_tokens:RULES",
)
