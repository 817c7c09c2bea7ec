"""``multiple_choice``: the output is exactly one of the choices, then EOS."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal, Union

import msgspec
from pydantic import model_validator

from ..entry_base import EntryLike, EntryModel, Text, TokenId, TokenIds, field_of
from ..fast_base import FastModel
from ..fast_base import TokenId as FastTokenId
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "MultipleChoice", "MultipleChoiceSpec", "needs_stop_token"]


class MultipleChoiceSpec(EntryModel):
    """The output is exactly one of ``choices`` (id sequences, or ``texts`` the worker resolves),
    then ``eos_token_id``: each step allows the next token of every choice the output still
    matches, and EOS once it is a whole choice."""

    kind: Literal["multiple_choice"] = "multiple_choice"
    choices: tuple[TokenIds, ...] = ()
    texts: tuple[Text, ...] = ()
    eos_token_id: TokenId | None = None

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"texts": "choices"})

    @model_validator(mode="after")
    def _some(self) -> MultipleChoiceSpec:
        if not self.choices and not self.texts:
            raise ValueError("give choices (token id sequences) or texts")
        return self


class MultipleChoice(FastModel, tag="multiple_choice", frozen=True):
    choices: Annotated[tuple[FastTokenIds, ...], msgspec.Meta(min_length=1)]
    eos_token_id: Union[FastTokenId, None] = None


def needs_stop_token(entry: EntryLike) -> bool:
    """Given as ids without ``eos_token_id`` (one given as texts takes the tokenizer's EOS)."""
    return field_of(entry, "eos_token_id") is None and not field_of(entry, "texts")


KIND = ProcessorKind(
    kind="multiple_choice", spec_model=MultipleChoiceSpec, fast_model=MultipleChoice, builtin=True,
    factory="dynlogits.processors.multiple_choice:factory",
    admission="dynlogits.specs.admission.multiple_choice:RULES",
    needs_stop_token=needs_stop_token,
    stop_token_use="without an eos_token_id of its own ends the chosen text with the request's stop token",
    eos_from_tokenizer="eos_token_id",
)
