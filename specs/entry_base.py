"""What every entry model shares: the field types, the base model and the text-field rule.

The built-in kinds' models (``specs/builtin/<kind>.py``) and plug-in models build on these; a
token id annotated with ``TokenId``/``TokenIds``/``TokenKey`` is found by the vocabulary check
(``specs.vocab``) wherever it is, however nested. This module imports neither torch nor an engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from .entry_like import EntryLike
from .limits import MAX_ABS_LOGIT_BIAS, MAX_TOKEN_ID
from .patterns import TOKEN_KEY_PATTERN
from .vocab import TOKEN_ID, TOKEN_KEY

__all__ = ["SCOPES", "BiasValue", "EntryLike", "EntryModel", "Scope", "Text", "TokenId", "TokenIds", "TokenKey", "field_of", "one_of",
           "unresolved_text"]

#: A token id (plug-in models use it too: ``check_vocab`` finds it wherever it is, however nested).
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID), TOKEN_ID]
TokenIds = Annotated[tuple[TokenId, ...], Field(min_length=1)]
TokenKey = Annotated[StrictStr, Field(pattern=TOKEN_KEY_PATTERN), TOKEN_KEY]
BiasValue = Annotated[StrictFloat, Field(allow_inf_nan=False, ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]

#: Which steps an entry applies at: every step, or only those of one phase of a request with
#: reasoning delimiters in force: inside a reasoning span, or outside it.
Scope = Literal["always", "reasoning", "answer"]
SCOPES: tuple[str, ...] = ("always", "reasoning", "answer")


#: Text the worker resolves to token ids with its tokenizer before it crosses the wire.
Text = Annotated[StrictStr, Field(min_length=1)]


def unresolved_text(entry: BaseModel) -> list[str]:
    """The text fields ``entry`` still sets: those its model's ``text_fields`` class variable names
    (text field -> the id field the worker resolves it into; built-in and plug-in models alike) whose
    value is neither ``None`` nor empty. Such an entry must be resolved before it crosses the wire."""
    return [name for name in getattr(type(entry), "text_fields", ()) if getattr(entry, name, None) not in (None, ())]


class EntryModel(BaseModel):
    """The base of every built-in entry model: frozen, unknown fields forbidden, a ``scope``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:  # every subclass declares ``kind: Literal["<kind>"]``
        kind: str

    #: the steps this entry applies at (``SCOPES``); left out of the wire form when ``"always"``
    scope: Scope = "always"

    #: fields holding text the worker resolves to ids (``text_fields``), each with the id field
    #: it becomes; an entry still holding text never crosses the wire
    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def unresolved_text(self) -> list[str]:
        """The text fields still set (they must be resolved before the wire)."""
        return unresolved_text(self)


def one_of(entry: EntryModel, ids: str, text: str, *, required: bool = True) -> None:
    """``ids`` or ``text``, not both (and at least one when ``required``); ``ValueError`` otherwise."""
    has_ids, has_text = getattr(entry, ids) not in (None, ()), getattr(entry, text) not in (None, ())
    if has_ids and has_text:
        raise ValueError(f"give {ids} or {text}, not both")
    if required and not (has_ids or has_text):
        raise ValueError(f"give {ids} (token ids) or {text} (text the worker resolves)")


def field_of(entry: EntryLike, name: str, default: Any = None) -> Any:
    """Field ``name`` of an entry given as a model or as its wire dict (``default`` when absent)."""
    return entry.get(name, default) if isinstance(entry, Mapping) else getattr(entry, name, default)
