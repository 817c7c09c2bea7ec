"""``trigger``: the first time the output ends with the trigger, force the phrase once."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Literal

from pydantic import model_validator

from ..entry_base import EntryModel, Text, TokenIds, one_of
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "Trigger", "TriggerSpec"]


class TriggerSpec(EntryModel):
    """The first time the output ends with the trigger, the phrase is forced, one token a step,
    then the output is free again (once per request)."""

    kind: Literal["trigger"] = "trigger"
    trigger_token_ids: TokenIds | None = None
    phrase_token_ids: TokenIds | None = None
    trigger_text: Text | None = None
    phrase_text: Text | None = None

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"trigger_text": "trigger_token_ids",
                                                                  "phrase_text": "phrase_token_ids"})

    @model_validator(mode="after")
    def _both(self) -> TriggerSpec:
        one_of(self, "trigger_token_ids", "trigger_text")
        one_of(self, "phrase_token_ids", "phrase_text")
        return self


class Trigger(FastModel, tag="trigger", frozen=True):
    trigger_token_ids: FastTokenIds
    phrase_token_ids: FastTokenIds


KIND = ProcessorKind(
    kind="trigger", spec_model=TriggerSpec, fast_model=Trigger, builtin=True,
    factory="dynlogits.processors.trigger:factory",
    admission="dynlogits.specs.admission.trigger:RULES",
)
