"""``min_tokens``: no stop/EOS token before a minimum number of generated tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import IndexCache

__all__ = ["MinTokensProcessor"]


class MinTokensProcessor:
    """While ``len(input_ids) < min_tokens`` the stop ids become -inf; afterwards nothing changes."""

    __slots__ = ("min_tokens", "_index")

    def __init__(self, min_tokens: int, stop_token_ids: Sequence[int]) -> None:
        self.min_tokens = min_tokens
        self._index = IndexCache(sorted(set(stop_token_ids)))

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        if len(input_ids) < self.min_tokens:
            idx, _ = self._index.get(logits)
            logits.index_fill_(0, idx, float("-inf"))
