"""Pydantic models of the logits-processor entries, discriminated by ``kind``.

Every model is frozen and forbids unknown fields. Token ids are strict integers
(``True`` and ``1.0`` are not ids) in ``[0, 2**31 - 1]``; the bound against the
model's vocabulary is checked where the vocabulary is known (``check_vocab``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictFloat, StrictInt, StrictStr, model_validator

from .limits import MAX_ABS_LOGIT_BIAS, MAX_DEADLINE_SECONDS, MAX_TOKEN_ID
from .patterns import FACTORY_PATTERN, TOKEN_KEY_PATTERN
from .vocab import BUILTIN_ENTRY_CLASSES, TOKEN_ID, TOKEN_KEY

__all__ = [
    "SCOPES",
    "AllowedTokensSpec",
    "BannedPhrasesSpec",
    "BannedTokensSpec",
    "DeadlineSpec",
    "Entry",
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
    "unresolved_text",
    "ENTRY_KINDS",
    "ENTRY_MODELS",
    "WIRE_MODELS",
    "WIRE_KINDS",
    "REQUEST_FORBIDDEN_KINDS",
]

#: A token id (plug-in models use it too: ``check_vocab`` finds it wherever it is, however nested).
TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID), TOKEN_ID]
TokenIds = Annotated[tuple[TokenId, ...], Field(min_length=1)]
TokenKey = Annotated[StrictStr, Field(pattern=TOKEN_KEY_PATTERN), TOKEN_KEY]
BiasValue = Annotated[StrictFloat, Field(allow_inf_nan=False, ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]


#: Which steps an entry applies at: every step, or only those of one phase of a request with
#: reasoning delimiters in force (``reasoning`` entry): inside a reasoning span, or outside it.
Scope = Literal["always", "reasoning", "answer"]
SCOPES: tuple[str, ...] = ("always", "reasoning", "answer")

#: Text the worker resolves to token ids with its tokenizer before it crosses the wire.
Text = Annotated[StrictStr, Field(min_length=1)]


def unresolved_text(entry: Any) -> list[str]:
    """The text fields ``entry`` still sets: those its model's ``text_fields`` class variable names
    (text field -> the id field the worker resolves it into; built-in and plug-in models alike) whose
    value is neither ``None`` nor empty. Such an entry must be resolved before it crosses the wire."""
    return [name for name in getattr(type(entry), "text_fields", ()) if getattr(entry, name, None) not in (None, ())]


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the steps this entry applies at (``SCOPES``); left out of the wire form when ``"always"``
    scope: Scope = "always"

    #: fields holding text the worker resolves to ids (``text_fields``), each with the id field
    #: it becomes; an entry still holding text never crosses the wire
    text_fields: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def unresolved_text(self) -> list[str]:
        """The text fields still set (they must be resolved before the wire)."""
        return unresolved_text(self)


def _one_of(entry: _Entry, ids: str, text: str, *, required: bool = True) -> None:
    """``ids`` or ``text``, not both (and at least one when ``required``)."""
    has_ids, has_text = getattr(entry, ids) not in (None, ()), getattr(entry, text) not in (None, ())
    if has_ids and has_text:
        raise ValueError(f"give {ids} or {text}, not both")
    if required and not (has_ids or has_text):
        raise ValueError(f"give {ids} (token ids) or {text} (text the worker resolves)")


class ForcedTokenSequenceSpec(_Entry):
    """Force ``token_ids`` in order (one per generated token), then ``eos_token_id``.

    Wire-compatible with ai-dynamo 1.6.1's ``forced_sequence`` entry.
    """

    kind: Literal["forced_sequence"] = "forced_sequence"
    token_ids: TokenIds
    eos_token_id: TokenId


class ForcedTextSpec(_Entry):
    """Force ``text``: resolved to a ``forced_sequence`` with the worker's tokenizer
    (``add_special_tokens=False``, EOS from the tokenizer) before it crosses the wire."""

    kind: Literal["forced_text"] = "forced_text"
    text: Annotated[StrictStr, Field(min_length=1)]


class BannedTokensSpec(_Entry):
    """``token_ids`` are never sampled (their logits are set to -inf every step)."""

    kind: Literal["banned_tokens"] = "banned_tokens"
    token_ids: TokenIds


class AllowedTokensSpec(_Entry):
    """Only ``token_ids`` (plus ``eos_token_id`` when given) may be sampled."""

    kind: Literal["allowed_tokens"] = "allowed_tokens"
    token_ids: TokenIds
    eos_token_id: TokenId | None = None


class LogitBiasSpec(_Entry):
    """Add ``bias[id]`` (in ``[-100, 100]``) to the logit of each token id (decimal string keys)."""

    kind: Literal["logit_bias"] = "logit_bias"
    bias: Annotated[dict[TokenKey, BiasValue], Field(min_length=1)]


class MinTokensSpec(_Entry):
    """Suppress ``stop_token_ids`` until ``min_tokens`` tokens have been generated."""

    kind: Literal["min_tokens"] = "min_tokens"
    min_tokens: Annotated[StrictInt, Field(ge=1)]
    stop_token_ids: TokenIds


class ThinkingBudgetSpec(_Entry):
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
        _one_of(self, "start_token_ids", "start_text", required=False)
        _one_of(self, "end_token_ids", "end_text", required=False)
        return self


class ReasoningSpec(_Entry):
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
        _one_of(self, "start_token_ids", "start_text")
        _one_of(self, "end_token_ids", "end_text")
        if self.scope != "always":
            raise ValueError("a reasoning entry declares the phases; its scope is always")
        return self


class BannedPhrasesSpec(_Entry):
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


class MultipleChoiceSpec(_Entry):
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


class TriggerSpec(_Entry):
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
        _one_of(self, "trigger_token_ids", "trigger_text")
        _one_of(self, "phrase_token_ids", "phrase_text")
        return self


class DeadlineSpec(_Entry):
    """``seconds`` after the request arrived, its stop token is forced."""

    kind: Literal["deadline"] = "deadline"
    seconds: Annotated[StrictFloat, Field(gt=0, le=MAX_DEADLINE_SECONDS, allow_inf_nan=False)]


class PromptTokensSpec(_Entry):
    """The request's own prompt tokens: ``boost`` adds ``boost`` to their logits; ``restrict``
    allows only them (and the request's stop tokens)."""

    kind: Literal["prompt_tokens"] = "prompt_tokens"
    mode: Literal["boost", "restrict"]
    boost: Annotated[StrictFloat, Field(gt=0, le=MAX_ABS_LOGIT_BIAS, allow_inf_nan=False)] = 2.0


class PythonProcessorSpec(_Entry):
    """Import ``factory`` (``module.path:Name``) and call it with ``kwargs``.

    Runs code on the worker, so it comes from operator config only: requests that
    carry it are rejected, and engines realize it only for allow-listed factories.
    """

    kind: Literal["python"] = "python"
    factory: Annotated[StrictStr, Field(pattern=FACTORY_PATTERN)]
    kwargs: dict[StrictStr, JsonValue] = Field(default_factory=dict)


Entry = Annotated[
    Union[
        ForcedTokenSequenceSpec,
        ForcedTextSpec,
        BannedTokensSpec,
        AllowedTokensSpec,
        LogitBiasSpec,
        MinTokensSpec,
        ThinkingBudgetSpec,
        ReasoningSpec,
        BannedPhrasesSpec,
        MultipleChoiceSpec,
        TriggerSpec,
        DeadlineSpec,
        PromptTokensSpec,
        PythonProcessorSpec,
    ],
    Field(discriminator="kind"),
]
"""Any entry a spec source (config, request, code) may hold."""

WireEntry = Annotated[
    Union[
        ForcedTokenSequenceSpec,
        BannedTokensSpec,
        AllowedTokensSpec,
        LogitBiasSpec,
        MinTokensSpec,
        ThinkingBudgetSpec,
        ReasoningSpec,
        BannedPhrasesSpec,
        MultipleChoiceSpec,
        TriggerSpec,
        DeadlineSpec,
        PromptTokensSpec,
        PythonProcessorSpec,
    ],
    Field(discriminator="kind"),
]
"""An entry that may cross the engine boundary (``forced_text`` is resolved first, and no entry
may still hold text: ``_Entry.unresolved_text``)."""

# The members of each union, in union order (the order of "expected one of" in errors).
ENTRY_MODELS: tuple[type[_Entry], ...] = get_args(get_args(Entry)[0])
WIRE_MODELS: tuple[type[_Entry], ...] = get_args(get_args(WireEntry)[0])
WIRE_KINDS: frozenset[str] = frozenset(m.model_fields["kind"].default for m in WIRE_MODELS)
ENTRY_KINDS: frozenset[str] = WIRE_KINDS | {"forced_text"}
# Kinds a client request may never carry, whatever the allow-list says.
REQUEST_FORBIDDEN_KINDS: frozenset[str] = frozenset({"python"})
BUILTIN_ENTRY_CLASSES.update(ENTRY_MODELS)  # the vocabulary check's fast pass reads them by field name
