"""Operator-side ``python`` factories the kit allow-lists for its own checks.

``raise_after(after)`` raises once a request generated ``after`` tokens (a processor fault);
``scale(scale)`` multiplies a row by a constant (a well-behaved opaque processor). Both are
stateless: their effect depends on the history alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["RAISE_AFTER_FACTORY", "SCALE_FACTORY", "raise_after", "scale"]

RAISE_AFTER_FACTORY = "dynlogits.testing.faults:raise_after"
SCALE_FACTORY = "dynlogits.testing.faults:scale"


class RaiseAfter:
    """Raises ``RuntimeError`` once ``after`` tokens were generated; does nothing before."""

    def __init__(self, after: int) -> None:
        self.after = after

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        if len(input_ids) >= self.after:
            raise RuntimeError(f"injected fault after {self.after} tokens")


class Scale:
    """``row *= factor`` every step."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        logits.mul_(self.factor)


def raise_after(after: int = 1) -> RaiseAfter:
    return RaiseAfter(after)


def scale(scale: float = 2.0) -> Scale:
    return Scale(scale)
