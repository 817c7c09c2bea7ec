"""Pydantic models of the logits-processor entries, discriminated by ``kind``.

Every model is frozen and forbids unknown fields. Token ids are strict integers
(``True`` and ``1.0`` are not ids) in ``[0, 2**31 - 1]``; the bound against the
model's vocabulary is checked where the vocabulary is known (``check_vocab``).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictFloat, StrictInt, StrictStr

from .limits import MAX_ABS_LOGIT_BIAS, MAX_TOKEN_ID
from .patterns import FACTORY_PATTERN, TOKEN_KEY_PATTERN

__all__ = [
    "AllowedTokensSpec",
    "BannedTokensSpec",
    "Entry",
    "ForcedTextSpec",
    "ForcedTokenSequenceSpec",
    "LogitBiasSpec",
    "MinTokensSpec",
    "PythonProcessorSpec",
    "ThinkingBudgetSpec",
    "TokenId",
    "TokenIds",
    "WireEntry",
    "ENTRY_KINDS",
    "ENTRY_MODELS",
    "WIRE_MODELS",
    "WIRE_KINDS",
    "REQUEST_FORBIDDEN_KINDS",
]

TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[tuple[TokenId, ...], Field(min_length=1)]
TokenKey = Annotated[StrictStr, Field(pattern=TOKEN_KEY_PATTERN)]
BiasValue = Annotated[StrictFloat, Field(allow_inf_nan=False, ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
    """Once ``budget`` tokens follow ``start_token_ids`` without ``end_token_ids``,
    force ``end_token_ids``."""

    kind: Literal["thinking_budget"] = "thinking_budget"
    start_token_ids: TokenIds
    end_token_ids: TokenIds
    budget: Annotated[StrictInt, Field(ge=0)]


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
        PythonProcessorSpec,
    ],
    Field(discriminator="kind"),
]
"""An entry that may cross the engine boundary (``forced_text`` is resolved first)."""

# The members of each union, in union order (the order of "expected one of" in errors).
ENTRY_MODELS: tuple[type[_Entry], ...] = get_args(get_args(Entry)[0])
WIRE_MODELS: tuple[type[_Entry], ...] = get_args(get_args(WireEntry)[0])
WIRE_KINDS: frozenset[str] = frozenset(m.model_fields["kind"].default for m in WIRE_MODELS)
ENTRY_KINDS: frozenset[str] = WIRE_KINDS | {"forced_text"}
# Kinds a client request may never carry, whatever the allow-list says.
REQUEST_FORBIDDEN_KINDS: frozenset[str] = frozenset({"python"})
