"""``dry`` ("Don't Repeat Yourself"): llama.cpp's and koboldcpp's sequence repetition penalty.

A token that would extend a stretch of the recent context which already occurred earlier, by at
least ``allowed_length`` tokens, loses ``multiplier * base ** (length - allowed_length)`` from its
logit; a sequence breaker (text, matched against the vocabulary as llama.cpp matches it) stops a
repeat from reaching back past it. The exact rule: docs/specs.md, ``dry``.

The work factors are bounded here, before any work: the look-back (``MAX_DRY_LOOKBACK`` tokens, also
what ``penalty_last_n: -1``, llama.cpp's "the whole context", means), the number of breakers
(``MAX_DRY_BREAKERS``) and the length of each (``MAX_DRY_BREAKER_CHARS``: llama.cpp keeps the first
40 bytes of a longer one; a longer one is refused here). A breaker's tail (the tokens after its first,
``MAX_DRY_TAIL_TOKENS``) is cut as llama.cpp cuts it.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from ..entry_base import EntryModel
from ..fast_base import FastModel
from ..kinds import ProcessorKind

__all__ = ["DEFAULT_BREAKERS", "KIND", "MAX_DRY_BASE", "MAX_DRY_BREAKERS", "MAX_DRY_BREAKER_CHARS", "MAX_DRY_LOOKBACK",
           "MAX_DRY_MULTIPLIER", "MAX_DRY_TAIL_TOKENS", "Dry", "DrySpec"]

#: The most tokens one step looks back over (the prompt's included); ``penalty_last_n: -1`` means this.
MAX_DRY_LOOKBACK = 2048
#: The most sequence breakers one entry may name.
MAX_DRY_BREAKERS = 16
#: The most characters of one breaker (llama.cpp's ``MAX_CHAR_LEN``, which it counts in bytes).
MAX_DRY_BREAKER_CHARS = 40
#: The most tokens of a breaker's tail that are matched (llama.cpp's ``MAX_SEQ_LEN``; longer ones are cut).
MAX_DRY_TAIL_TOKENS = 20
#: ``multiplier`` and ``base`` at most (llama.cpp sets none; enough to make any repeat impossible).
MAX_DRY_MULTIPLIER = 100.0
MAX_DRY_BASE = 100.0
#: llama.cpp's default breakers (``common/common.h``, ``dry_sequence_breakers``).
DEFAULT_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

Breaker = Annotated[StrictStr, Field(min_length=1, max_length=MAX_DRY_BREAKER_CHARS)]
FastBreaker = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DRY_BREAKER_CHARS)]


class DrySpec(EntryModel):
    """A token that would extend a repeat of at least ``allowed_length`` tokens within the last
    ``penalty_last_n`` tokens (``-1``: the most allowed, ``MAX_DRY_LOOKBACK``; ``0``: off) of the
    prompt and the output (the output alone with ``include_prompt: false``) loses ``multiplier *
    base ** (length - allowed_length)``. ``multiplier`` 0 is off. ``sequence_breakers`` are text,
    matched against the engine's vocabulary at realization (``[]``: none, needs no vocabulary)."""

    kind: Literal["dry"] = "dry"
    multiplier: Annotated[StrictFloat, Field(ge=0, le=MAX_DRY_MULTIPLIER, allow_inf_nan=False)]
    base: Annotated[StrictFloat, Field(ge=1, le=MAX_DRY_BASE, allow_inf_nan=False)] = 1.75
    allowed_length: Annotated[StrictInt, Field(ge=1, le=MAX_DRY_LOOKBACK)] = 2
    sequence_breakers: Annotated[tuple[Breaker, ...], Field(max_length=MAX_DRY_BREAKERS)] = DEFAULT_BREAKERS
    penalty_last_n: Annotated[StrictInt, Field(ge=-1, le=MAX_DRY_LOOKBACK)] = -1
    include_prompt: StrictBool = True


class Dry(FastModel, tag="dry", frozen=True):
    multiplier: Annotated[float, msgspec.Meta(ge=0, le=MAX_DRY_MULTIPLIER)]
    base: Annotated[float, msgspec.Meta(ge=1, le=MAX_DRY_BASE)] = 1.75
    allowed_length: Annotated[int, msgspec.Meta(ge=1, le=MAX_DRY_LOOKBACK)] = 2
    sequence_breakers: Annotated[tuple[FastBreaker, ...], msgspec.Meta(max_length=MAX_DRY_BREAKERS)] = DEFAULT_BREAKERS
    penalty_last_n: Annotated[int, msgspec.Meta(ge=-1, le=MAX_DRY_LOOKBACK)] = -1
    include_prompt: bool = True


KIND = ProcessorKind(
    kind="dry", spec_model=DrySpec, fast_model=Dry, builtin=True,
    factory="dynlogits.processors.dry:factory",
    admission="dynlogits.specs.admission.dry:RULES",
)
