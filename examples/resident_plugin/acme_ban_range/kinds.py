"""The kinds' declarations: pydantic only, never torch (the frontend and the CLI load this module)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from dynlogits.specs.entries import TokenId
from dynlogits.specs.kinds import ProcessorKind

__all__ = ["BAN_RANGE", "NO_REPEAT_NGRAM", "BanRangeSpec", "NoRepeatNgramSpec"]


class BanRangeSpec(BaseModel):
    """Ban every id in ``[start, stop)`` (ids past the logits width do not exist: ``stop`` is clipped)."""

    model_config = ConfigDict(frozen=True, extra="forbid",
                              json_schema_extra={"examples": [{"kind": "acme.ban_range", "start": 20, "stop": 40}]})
    kind: Literal["acme.ban_range"] = "acme.ban_range"
    start: TokenId  # an id: the worker and the engine check it against the logits width
    stop: Annotated[StrictInt, Field(ge=1)]

    @model_validator(mode="after")
    def _not_empty(self) -> BanRangeSpec:
        if self.stop <= self.start:
            raise ValueError("stop must be greater than start")
        return self


class NoRepeatNgramSpec(BaseModel):
    """Ban every token that would repeat an ``n``-gram the request already generated."""

    model_config = ConfigDict(frozen=True, extra="forbid",
                              json_schema_extra={"examples": [{"kind": "acme.no_repeat_ngram", "n": 2}]})
    kind: Literal["acme.no_repeat_ngram"] = "acme.no_repeat_ngram"
    n: Annotated[StrictInt, Field(ge=1, le=16)]


BAN_RANGE = ProcessorKind("acme.ban_range", BanRangeSpec, "acme_ban_range.processors:make_ban_range")
NO_REPEAT_NGRAM = ProcessorKind("acme.no_repeat_ngram", NoRepeatNgramSpec, "acme_ban_range.processors:make_no_repeat_ngram")
