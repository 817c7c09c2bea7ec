"""What every msgspec decode twin shares (the worker's fast decode path, ``specs.fast``): the
field types and the tagged base struct. Same type rules as ``specs.entry_base``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .limits import MAX_ABS_LOGIT_BIAS, MAX_TOKEN_ID

__all__ = ["BiasValue", "FastModel", "Scope", "TokenId", "TokenIds", "TokenKey", "token_key_ok"]

TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[tuple[TokenId, ...], msgspec.Meta(min_length=1)]
# ``TOKEN_KEY_PATTERN`` is checked after conversion (``FastModel.passes_post_checks``), not by a
# ``Meta(pattern=...)``: msgspec would run a Python regex per key (``token_key_ok`` instead).
TokenKey = str
BiasValue = Annotated[float, msgspec.Meta(ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]

Scope = Literal["always", "reasoning", "answer"]  # entry_base.Scope


class FastModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", kw_only=True):
    """The base of every decode twin: tagged by ``kind``, unknown fields refused."""

    scope: Scope = "always"

    def passes_post_checks(self) -> bool:
        """The rules msgspec's types do not carry (checked after conversion); ``True`` by default."""
        return True


def token_key_ok(key: str) -> bool:
    """``TOKEN_KEY_PATTERN`` (ASCII decimal, at most 10 digits, no leading zero), without a regex."""
    return key.isascii() and key.isdecimal() and len(key) <= 10 and (len(key) == 1 or key[0] != "0")
