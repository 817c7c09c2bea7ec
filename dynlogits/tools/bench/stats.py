"""A distribution-free confidence interval for a median, for the engine suite's paired ratios.

Round-to-round noise on a shared host is heavy-tailed (single rounds' ratios 0.75-1.84 have been
seen), so the interval assumes nothing about its shape: the rounds are independent draws, and the
median lies between the k-th smallest and the k-th largest value with probability
``1 - 2 * P(Binomial(n, 1/2) < k)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb

__all__ = ["MedianInterval", "median_interval"]


@dataclass(frozen=True)
class MedianInterval:
    """``[low, high]`` holds the median with probability at least ``confidence``."""

    low: float
    high: float
    confidence: float


def median_interval(values: Sequence[float], confidence: float = 0.95) -> MedianInterval:
    """The narrowest order-statistic interval with at least ``confidence``; with too few values for
    that (fewer than 6 at 0.95), the lowest and highest value and the confidence they give.
    ``ValueError`` without values or with a confidence outside ``(0, 1)``."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence}")
    ordered = sorted(values)
    n = len(ordered)

    def held(k: int) -> float:  # confidence of [k-th smallest, k-th largest], k from 1
        return 1.0 - 2.0 * sum(comb(n, i) for i in range(k)) / 2.0**n

    k = 1
    while k < (n + 1) // 2 and held(k + 1) >= confidence:
        k += 1
    return MedianInterval(ordered[k - 1], ordered[n - k], held(k))
