"""msgspec mirror of the wire entries: the worker's fast decode path.

Each built-in kind declares its twin beside its pydantic model (``ProcessorKind.fast_model``,
``dynlogits.specs.builtin.<kind>``): same fields and type rules (what msgspec's types do not carry,
e.g. a bias key's pattern and finite values, a twin checks in ``passes_post_checks``); limits
and the vocabulary bound are shared functions. This module derives the decode table from the
declarations, in union order. Tests keep the two definitions in step (accepting and rejecting the
same payloads). The twins' names stay importable from here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Union

import msgspec

from .builtin import (
    DECLARED,
    AllowedTokens,
    BannedPhrases,
    BannedTokens,
    Deadline,
    ForcedSequence,
    LogitBias,
    MinTokens,
    MultipleChoice,
    PromptTokens,
    Python,
    Reasoning,
    ThinkingBudget,
    Trigger,
)
from .fast_base import BiasValue, FastModel, Scope, TokenId, TokenIds, TokenKey, token_key_ok

__all__ = ["BY_KIND", "FAST_MODELS", "FAST_TO_MODEL", "AllowedTokens", "BannedPhrases", "BannedTokens", "BiasValue",
           "Deadline", "FastEntry", "FastModel", "ForcedSequence", "LogitBias", "MinTokens", "MultipleChoice",
           "PromptTokens", "Python", "Reasoning", "Scope", "ThinkingBudget", "TokenId", "TokenIds", "TokenKey", "Trigger",
           "convert_entry", "token_key_ok"]

#: The decode twins of the built-in kinds that have one, in union order.
FAST_MODELS: tuple[type[FastModel], ...] = tuple(k.fast_model for k in DECLARED if k.fast_model is not None)
#: kind -> its twin.
BY_KIND: dict[str, type[FastModel]] = {k.kind: k.fast_model for k in DECLARED if k.fast_model is not None}
#: twin -> the pydantic model it mirrors.
FAST_TO_MODEL: Mapping[type, type] = MappingProxyType(
    {k.fast_model: k.spec_model for k in DECLARED if k.fast_model is not None})

if TYPE_CHECKING:  # to a type checker a decoded twin is its base; at run time, the tagged union
    FastEntry = FastModel
else:
    FastEntry = Union[FAST_MODELS]


def convert_entry(item: Any) -> FastModel:
    """One wire entry dict -> its struct, by its ``kind`` tag; ``msgspec.ValidationError`` if it is not one.
    Converts to the tagged struct class, not the ``FastEntry`` union, so msgspec reuses the type
    information cached per class (``msgspec.convert`` rebuilds a union's type tree on every call)."""
    kind = item.get("kind") if type(item) is dict else None
    model = BY_KIND.get(kind) if type(kind) is str else None
    if model is None:
        raise msgspec.ValidationError(f"not a built-in wire entry: kind {kind!r}")
    return msgspec.convert(item, model, strict=True)
