"""``thinking_budget``: end a thinking span once it has run ``budget`` tokens."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal, Union

import msgspec
from pydantic import Field, StrictInt, model_validator

from ..entry_base import EntryLike, EntryModel, Text, TokenIds, field_of, one_of
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "ThinkingBudget", "ThinkingBudgetSpec", "reads_delimiters"]


class ThinkingBudgetSpec(EntryModel):
    """Once ``budget`` tokens follow ``start_token_ids`` without ``end_token_ids``, force
    ``end_token_ids``. Without delimiters of its own, the request's ``reasoning`` delimiters; a
    span the prompt left open counts from the prompt (``docs/specs.md``)."""

    kind: Literal["thinking_budget"] = "thinking_budget"
    start_token_ids: TokenIds | None = None
    end_token_ids: TokenIds | None = None
    budget: Annotated[StrictInt, Field(ge=0)]
    start_text: Text | None = None
    end_text: Text | None = None

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"start_text": "start_token_ids",
                                                                  "end_text": "end_token_ids"})

    @model_validator(mode="after")
    def _delimiters(self) -> ThinkingBudgetSpec:
        one_of(self, "start_token_ids", "start_text", required=False)
        one_of(self, "end_token_ids", "end_text", required=False)
        return self


class ThinkingBudget(FastModel, tag="thinking_budget", frozen=True):
    budget: Annotated[int, msgspec.Meta(ge=0)]
    start_token_ids: Union[FastTokenIds, None] = None
    end_token_ids: Union[FastTokenIds, None] = None


def reads_delimiters(entry: EntryLike) -> bool:
    """Without delimiters of its own (ids or text, start or end) it counts on the request's."""
    return (field_of(entry, "start_token_ids") is None and not field_of(entry, "start_text")
            or field_of(entry, "end_token_ids") is None and not field_of(entry, "end_text"))


KIND = ProcessorKind(
    kind="thinking_budget", spec_model=ThinkingBudgetSpec, fast_model=ThinkingBudget, builtin=True,
    factory="dynlogits.processors.thinking_budget:factory",
    admission="dynlogits.specs.admission.thinking_budget:RULES",
    reads_delimiters=reads_delimiters,
    # vLLM's own budget (``SamplingParams.thinking_token_budget``) ends the same span on its own count
    conflicts_with=("thinking_token_budget",),
)
