"""msgspec mirror of the wire entries: the worker's fast decode path.

Same fields and the same type rules as ``entries.py``; limits and the vocabulary
bound are shared functions. A test keeps the two definitions from drifting, and a
property test shows both accept and reject the same payloads.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

from .patterns import FACTORY_PATTERN, TOKEN_KEY_PATTERN
from .limits import MAX_ABS_LOGIT_BIAS, MAX_TOKEN_ID

TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[tuple[TokenId, ...], msgspec.Meta(min_length=1)]
TokenKey = Annotated[str, msgspec.Meta(pattern=TOKEN_KEY_PATTERN)]
BiasValue = Annotated[float, msgspec.Meta(ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]


class _Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    pass


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
    start_token_ids: TokenIds
    end_token_ids: TokenIds
    budget: Annotated[int, msgspec.Meta(ge=0)]


class Python(_Entry, tag="python"):
    factory: Annotated[str, msgspec.Meta(pattern=FACTORY_PATTERN)]
    kwargs: dict[str, Any] = {}


FastEntry = Union[ForcedSequence, BannedTokens, AllowedTokens, LogitBias, MinTokens, ThinkingBudget, Python]
FAST_MODELS: tuple[type[_Entry], ...] = FastEntry.__args__  # type: ignore[attr-defined]
