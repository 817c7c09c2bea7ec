"""``watermark``: the Gumbel-max watermark of vLLM 0.32 (``scheme: gumbel``, Philox PRF), drawn by the
request's processors so that any engine's output is found by vLLM's own ``GumbelWatermarkDetector``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictInt, field_validator

from ..entry_base import EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind

__all__ = ["DEFAULT_CONTEXT_WIDTH", "KIND", "MAX_CONTEXT_WIDTH", "MAX_DETECT_TOKENS", "MAX_KEY", "Watermark",
           "WatermarkSpec"]

#: The largest key: 64 bits, as vLLM's ``PhiloxPRF``.
MAX_KEY = 2**64 - 1
#: vLLM's default context width (``WatermarkConfig.context_width``).
DEFAULT_CONTEXT_WIDTH = 4
#: The widest context: each step absorbs ``ceil(width / 4)`` Philox blocks and compares contexts of
#: this many ids (vLLM warns above 16: every edited token then breaks more contexts).
MAX_CONTEXT_WIDTH = 32
#: The most ids one detection scores (its work is linear in them).
MAX_DETECT_TOKENS = 262_144


class WatermarkSpec(EntryModel):
    """Each sampled token is drawn by the Gumbel-max trick with vLLM 0.32's Philox PRF of ``key``
    over the ``context_width`` output tokens before it, then forced: the output's distribution is
    the model's, and vLLM's ``GumbelWatermarkDetector(key, context_width, prf="philox")`` finds it.
    Greedy requests are left as they are. The entry must be the payload's last (admission)."""

    kind: Literal["watermark"] = "watermark"
    scheme: Literal["gumbel"] = "gumbel"
    key: Annotated[StrictInt, Field(ge=0, le=MAX_KEY, repr=False)]  # a secret: in no repr
    context_width: Annotated[StrictInt, Field(ge=1, le=MAX_CONTEXT_WIDTH)] = DEFAULT_CONTEXT_WIDTH

    @field_validator("scope")
    @classmethod
    def _always(cls, scope: str) -> str:
        if scope != "always":
            raise ValueError("a watermark applies to every step of the output (scope must be 'always')")
        return scope


class Watermark(FastModel, tag="watermark", frozen=True, kw_only=True):
    scheme: Literal["gumbel"] = "gumbel"
    key: Annotated[int, msgspec.Meta(ge=0)]  # msgspec bounds fit int64; the 64-bit bound is a post-check
    context_width: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONTEXT_WIDTH)] = DEFAULT_CONTEXT_WIDTH

    def passes_post_checks(self) -> bool:
        return self.scope == "always" and self.key <= MAX_KEY

    def __repr__(self) -> str:  # the key is a secret: in no repr
        return f"Watermark(scheme={self.scheme!r}, context_width={self.context_width}, scope={self.scope!r})"


KIND = ProcessorKind(
    kind="watermark", spec_model=WatermarkSpec, fast_model=Watermark, builtin=True,
    factory="dynlogits.processors.watermark:factory",
    admission="dynlogits.specs.admission.watermark:RULES",
    # vLLM's V1 runner applies these after the processors: the draw could not follow them
    conflicts_with=("repetition_penalty", "frequency_penalty", "presence_penalty"),
)
