"""The request's sampling parameters as a factory sees them: one engine-neutral, read-only view."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["SamplingView"]


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else ``None`` (absent, not a number, or a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any, *, off_at_or_below: int | None = None) -> int | None:
    """``value`` as an int, else ``None``; ``None`` too at or below ``off_at_or_below`` (an engine's
    "disabled": vLLM's ``top_k`` of 0 or -1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return None if off_at_or_below is not None and value <= off_at_or_below else value


@dataclass(frozen=True)
class SamplingView:
    """What a request samples with, in the same words on every engine; a field is ``None`` where the
    engine does not say or the setting is off.

    ``temperature``, ``top_p``, ``min_p``: as the engine holds them (0 temperature: greedy; SGLang
    holds a greedy request as temperature 1 with ``top_k`` 1);
    ``top_k``: ``None`` when off (vLLM's and SGLang's -1 or 0); ``seed``: the request's seed;
    ``max_tokens``: the most tokens it may generate; ``n``: how many sequences it asks for (each is
    its own row, see docs/specs.md "Writing a kind"). Never mutated: the engine's parameters stay its own."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    n: int | None = None

    @classmethod
    def read(cls, params: Any, *, max_tokens: str = "max_tokens", seed: str = "seed", n: str = "n") -> SamplingView:
        """The view of an engine's parameter object (``None``: an empty view), reading the attribute
        names every engine shares and, for those engines spell differently, the names given
        (SGLang: ``max_tokens="max_new_tokens"``, ``seed="sampling_seed"``). Never raises: a missing
        or odd attribute reads as ``None``."""
        if params is None:
            return cls()
        return cls(temperature=_number(getattr(params, "temperature", None)),
                   top_p=_number(getattr(params, "top_p", None)),
                   top_k=_count(getattr(params, "top_k", None), off_at_or_below=0),
                   min_p=_number(getattr(params, "min_p", None)),
                   seed=_count(getattr(params, seed, None)),
                   max_tokens=_count(getattr(params, max_tokens, None)),
                   n=_count(getattr(params, n, None)))
