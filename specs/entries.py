"""The entry unions, discriminated by ``kind``, and the kind sets derived from the built-in declarations.

Every built-in kind is declared once, in ``dynlogits.specs.builtin.<kind>`` (its model, its decode
twin, its ``ProcessorKind``); this module derives what lists them: ``Entry`` (any entry a spec source
may hold), ``WireEntry`` (those that cross the engine boundary), their members and kind sets. Every
model is frozen and forbids unknown fields. Token ids are strict integers (``True`` and ``1.0`` are
not ids) in ``[0, 2**31 - 1]``; the bound against the model's vocabulary is checked where the
vocabulary is known (``check_vocab``). The models' names stay importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union, cast

from pydantic import Field

from .builtin import (
    BUILTIN,
    DECLARED,
    AllowedTokensSpec,
    BannedPhrasesSpec,
    BannedTokensSpec,
    DeadlineSpec,
    ForcedTextSpec,
    ForcedTokenSequenceSpec,
    LogitBiasSpec,
    MinTokensSpec,
    MultipleChoiceSpec,
    PromptTokensSpec,
    PythonProcessorSpec,
    ReasoningSpec,
    ThinkingBudgetSpec,
    TriggerSpec,
)
from .entry_base import SCOPES, EntryModel, Scope, Text, TokenId, TokenIds, TokenKey, unresolved_text
from .errors import RESOLVED_ON_WORKER
from .kinds import ProcessorKind, plugin_kinds
from .vocab import BUILTIN_ENTRY_CLASSES

__all__ = [
    "SCOPES",
    "AllowedTokensSpec",
    "BannedPhrasesSpec",
    "BannedTokensSpec",
    "DeadlineSpec",
    "Entry",
    "EntryModel",
    "ForcedTextSpec",
    "ForcedTokenSequenceSpec",
    "LogitBiasSpec",
    "MinTokensSpec",
    "MultipleChoiceSpec",
    "PromptTokensSpec",
    "PythonProcessorSpec",
    "ReasoningSpec",
    "Scope",
    "Text",
    "ThinkingBudgetSpec",
    "TriggerSpec",
    "TokenId",
    "TokenIds",
    "TokenKey",
    "WireEntry",
    "declaration",
    "unresolved_text",
    "BUILTIN",
    "DELIMITER_KINDS",
    "ENTRY_KINDS",
    "ENTRY_MODELS",
    "WIRE_MODELS",
    "WIRE_KINDS",
    "REQUEST_FORBIDDEN_KINDS",
]

# The members of each union, in union order (the order of "expected one of" in errors).
# (Every built-in model is an ``EntryModel``; a declaration types it as any pydantic model.)
ENTRY_MODELS: tuple[type[EntryModel], ...] = tuple(cast("type[EntryModel]", k.spec_model) for k in DECLARED)
WIRE_MODELS: tuple[type[EntryModel], ...] = tuple(cast("type[EntryModel]", k.spec_model) for k in DECLARED if k.wire)

if TYPE_CHECKING:  # to a type checker an entry is its base; at run time, the discriminated union
    Entry = EntryModel
    WireEntry = EntryModel
else:
    Entry = Annotated[Union[ENTRY_MODELS], Field(discriminator="kind")]
    """Any entry a spec source (config, request, code) may hold."""

    WireEntry = Annotated[Union[WIRE_MODELS], Field(discriminator="kind")]
    """An entry that may cross the engine boundary (kinds declared ``wire=False`` are resolved first,
    and no entry may still hold text: ``EntryModel.unresolved_text``)."""

WIRE_KINDS: frozenset[str] = frozenset(k.kind for k in DECLARED if k.wire)
ENTRY_KINDS: frozenset[str] = frozenset(BUILTIN)
#: Kinds a client request may never carry, whatever the allow-list says.
REQUEST_FORBIDDEN_KINDS: frozenset[str] = frozenset(k.kind for k in DECLARED if not k.client_allowed)
#: Kinds whose entry declares the request's reasoning delimiters (at most one such entry per payload).
DELIMITER_KINDS: frozenset[str] = frozenset(k.kind for k in DECLARED if k.delimiters)
BUILTIN_ENTRY_CLASSES.update(ENTRY_MODELS)  # the vocabulary check's fast pass reads them by field name
RESOLVED_ON_WORKER.update({k.kind: k.resolves_to for k in DECLARED if k.resolves_to is not None})


def declaration(kind: Any, plugins: Mapping[str, ProcessorKind] | None = None) -> ProcessorKind | None:
    """The declaration of ``kind``: a built-in one, else a plug-in kind in force (``plugins``:
    those, default ``plugin_kinds()``); ``None`` for anything else (a non-string included)."""
    if not isinstance(kind, str):
        return None
    found = BUILTIN.get(kind)
    if found is not None:
        return found
    return (plugin_kinds() if plugins is None else plugins).get(kind)
