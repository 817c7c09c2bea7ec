"""``reasoning``: the request's reasoning delimiters. No processor of its own: the other entries'
``scope`` and ``thinking_budget`` read them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Literal

from pydantic import model_validator

from ..entry_base import EntryModel, Text, TokenIds, one_of
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "Reasoning", "ReasoningSpec"]


class ReasoningSpec(EntryModel):
    """The request's reasoning delimiters: a reasoning span opens after ``start`` and closes after
    ``end`` (tokens of the prompt included). No processor of its own: ``scope`` of the other entries
    and ``thinking_budget`` read it. At most one per payload; its own ``scope`` is ``always``."""

    kind: Literal["reasoning"] = "reasoning"
    start_token_ids: TokenIds | None = None
    end_token_ids: TokenIds | None = None
    start_text: Text | None = None
    end_text: Text | None = None

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"start_text": "start_token_ids",
                                                                  "end_text": "end_token_ids"})

    @model_validator(mode="after")
    def _delimiters(self) -> ReasoningSpec:
        one_of(self, "start_token_ids", "start_text")
        one_of(self, "end_token_ids", "end_text")
        if self.scope != "always":
            raise ValueError("a reasoning entry declares the phases; its scope is always")
        return self


class Reasoning(FastModel, tag="reasoning", frozen=True):
    start_token_ids: FastTokenIds
    end_token_ids: FastTokenIds


KIND = ProcessorKind(
    kind="reasoning", spec_model=ReasoningSpec, fast_model=Reasoning, builtin=True, factory=None, delimiters=True,
    admission="dynlogits.specs.admission.reasoning:RULES",
)
