"""``logit_bias``: add a bias to the logit of each token id."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from pydantic import Field

from ..entry_base import BiasValue, EntryModel, TokenKey
from ..fast_base import BiasValue as FastBiasValue
from ..fast_base import FastModel, token_key_ok
from ..fast_base import TokenKey as FastTokenKey
from ..kinds import ProcessorKind

__all__ = ["KIND", "LogitBias", "LogitBiasSpec"]


class LogitBiasSpec(EntryModel):
    """Add ``bias[id]`` (in ``[-100, 100]``) to the logit of each token id (decimal string keys)."""

    kind: Literal["logit_bias"] = "logit_bias"
    bias: Annotated[dict[TokenKey, BiasValue], Field(min_length=1)]


class LogitBias(FastModel, tag="logit_bias", frozen=True):
    bias: Annotated[dict[FastTokenKey, FastBiasValue], msgspec.Meta(min_length=1)]

    def passes_post_checks(self) -> bool:
        """Finite biases keyed by decimal token ids (the rules msgspec's types do not carry)."""
        return all(math.isfinite(v) and token_key_ok(k) for k, v in self.bias.items())


KIND = ProcessorKind(
    kind="logit_bias", spec_model=LogitBiasSpec, fast_model=LogitBias, builtin=True,
    factory="dynlogits.processors.logit_bias:factory",
    admission="dynlogits.specs.admission.logit_bias:RULES",
)
