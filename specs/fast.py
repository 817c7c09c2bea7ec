"""msgspec mirror of the wire entries: the worker's fast decode path.

Same fields and type rules as ``entries.py`` (a logit_bias key's pattern and finite values are
checked after conversion, ``specs.wire``); limits and the vocabulary bound are shared functions.
Tests keep the two definitions in step (accepting and rejecting the same payloads)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from .limits import MAX_ABS_LOGIT_BIAS, MAX_DEADLINE_SECONDS, MAX_TOKEN_ID
from .patterns import FACTORY_PATTERN

TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[tuple[TokenId, ...], msgspec.Meta(min_length=1)]
# ``TOKEN_KEY_PATTERN`` is checked by ``token_key_ok`` after conversion, not by a ``Meta(pattern=...)``:
# msgspec runs a Python regex per key, which made a 50-key bias cost ~4x the whole pydantic decode.
TokenKey = str
BiasValue = Annotated[float, msgspec.Meta(ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]


Scope = Literal["always", "reasoning", "answer"]


class _Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", kw_only=True):
    scope: Scope = "always"


class ForcedSequence(_Entry, tag="forced_sequence"):
    token_ids: TokenIds
    eos_token_id: TokenId


class BannedTokens(_Entry, tag="banned_tokens"):
    token_ids: TokenIds


class AllowedTokens(_Entry, tag="allowed_tokens"):
    token_ids: TokenIds
    eos_token_id: Union[TokenId, None] = None


class LogitBias(_Entry, tag="logit_bias"):
    bias: Annotated[dict[TokenKey, BiasValue], msgspec.Meta(min_length=1)]


class MinTokens(_Entry, tag="min_tokens"):
    min_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_token_ids: TokenIds


class ThinkingBudget(_Entry, tag="thinking_budget"):
    budget: Annotated[int, msgspec.Meta(ge=0)]
    start_token_ids: Union[TokenIds, None] = None
    end_token_ids: Union[TokenIds, None] = None


class Reasoning(_Entry, tag="reasoning"):
    start_token_ids: TokenIds
    end_token_ids: TokenIds


class BannedPhrases(_Entry, tag="banned_phrases"):
    phrases: Annotated[tuple[TokenIds, ...], msgspec.Meta(min_length=1)]


class MultipleChoice(_Entry, tag="multiple_choice"):
    choices: Annotated[tuple[TokenIds, ...], msgspec.Meta(min_length=1)]
    eos_token_id: Union[TokenId, None] = None


class Trigger(_Entry, tag="trigger"):
    trigger_token_ids: TokenIds
    phrase_token_ids: TokenIds


class Deadline(_Entry, tag="deadline"):
    seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_DEADLINE_SECONDS)]


class PromptTokens(_Entry, tag="prompt_tokens"):
    mode: Literal["boost", "restrict"]
    boost: Annotated[float, msgspec.Meta(gt=0, le=MAX_ABS_LOGIT_BIAS)] = 2.0


class Python(_Entry, tag="python"):
    factory: Annotated[str, msgspec.Meta(pattern=FACTORY_PATTERN)]
    kwargs: dict[str, Any] = {}


def token_key_ok(key: str) -> bool:
    """``TOKEN_KEY_PATTERN`` (ASCII decimal, at most 10 digits, no leading zero), without a regex."""
    return key.isascii() and key.isdecimal() and len(key) <= 10 and (len(key) == 1 or key[0] != "0")


FastEntry = Union[ForcedSequence, BannedTokens, AllowedTokens, LogitBias, MinTokens, ThinkingBudget, Reasoning,
                  BannedPhrases, MultipleChoice, Trigger, Deadline, PromptTokens, Python]
FAST_MODELS: tuple[type[_Entry], ...] = FastEntry.__args__  # type: ignore[attr-defined]
BY_KIND: dict[str, type[_Entry]] = {model.__struct_config__.tag: model for model in FAST_MODELS}  # type: ignore[misc]


def convert_entry(item: Any) -> FastEntry:
    """One wire entry dict -> its struct, by its ``kind`` tag; ``msgspec.ValidationError`` if it is not one.
    Converts to the tagged struct class, not the ``FastEntry`` union, so msgspec reuses the type
    information cached per class (``msgspec.convert`` rebuilds a union's type tree on every call)."""
    kind = item.get("kind") if type(item) is dict else None
    model = BY_KIND.get(kind) if type(kind) is str else None
    if model is None:
        raise msgspec.ValidationError(f"not a built-in wire entry: kind {kind!r}")
    return msgspec.convert(item, model, strict=True)
