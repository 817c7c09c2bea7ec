"""``forced_sequence``: force ``token_ids`` in order, then ``eos_token_id`` (ai-dynamo 1.6.1's entry)."""

from __future__ import annotations

from typing import Literal

from ..entry_base import EntryModel, TokenId, TokenIds
from ..fast_base import FastModel
from ..fast_base import TokenId as FastTokenId
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "ForcedSequence", "ForcedTokenSequenceSpec"]


class ForcedTokenSequenceSpec(EntryModel):
    """Force ``token_ids`` in order (one per generated token), then ``eos_token_id``.

    Wire-compatible with ai-dynamo 1.6.1's ``forced_sequence`` entry.
    """

    kind: Literal["forced_sequence"] = "forced_sequence"
    token_ids: TokenIds
    eos_token_id: TokenId


class ForcedSequence(FastModel, tag="forced_sequence", frozen=True):
    token_ids: FastTokenIds
    eos_token_id: FastTokenId


KIND = ProcessorKind(
    kind="forced_sequence", spec_model=ForcedTokenSequenceSpec, fast_model=ForcedSequence, builtin=True,
    factory="dynlogits.processors.forced_sequence:factory",
    admission="dynlogits.specs.admission.forced_sequence:RULES",
)
