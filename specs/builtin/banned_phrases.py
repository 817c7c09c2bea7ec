"""``banned_phrases``: a phrase's last token is masked wherever the output ends with the rest of it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, ClassVar, Literal

import msgspec
from pydantic import model_validator

from ..entry_base import EntryModel, Text, TokenIds
from ..fast_base import FastModel
from ..fast_base import TokenIds as FastTokenIds
from ..kinds import ProcessorKind

__all__ = ["KIND", "BannedPhrases", "BannedPhrasesSpec"]


class BannedPhrasesSpec(EntryModel):
    """A phrase's last token is masked at every step where the output ends with the rest of it (a
    one-token phrase is always masked). ``texts`` are resolved by the worker the way vLLM resolves
    ``bad_words``: as given and with one leading space."""

    kind: Literal["banned_phrases"] = "banned_phrases"
    phrases: tuple[TokenIds, ...] = ()
    texts: tuple[Text, ...] = ()

    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({"texts": "phrases"})

    @model_validator(mode="after")
    def _some(self) -> BannedPhrasesSpec:
        if not self.phrases and not self.texts:
            raise ValueError("give phrases (token id sequences) or texts")
        return self


class BannedPhrases(FastModel, tag="banned_phrases", frozen=True):
    phrases: Annotated[tuple[FastTokenIds, ...], msgspec.Meta(min_length=1)]


KIND = ProcessorKind(
    kind="banned_phrases", spec_model=BannedPhrasesSpec, fast_model=BannedPhrases, builtin=True,
    factory="dynlogits.processors.banned_phrases:factory",
    admission="dynlogits.specs.admission.banned_phrases:RULES",
    text_as_bad_words=True,
)
