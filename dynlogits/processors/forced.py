"""``forced_sequence``: force the configured tokens in order, then EOS."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ops import ForceToken, RowOp, apply_op
from .templates import ForceSeqTemplate

__all__ = ["ForcedSequenceProcessor"]


class ForcedSequenceProcessor:
    """At step ``n = len(input_ids)`` force ``token_ids[n]``; from ``n = len(token_ids)`` on, force EOS
    (forcing never unmasks: see ``ops.ForceToken``).

    Stateless: the position is the number of generated tokens, so recomputation
    after preemption, or a second call at the same step, gives the same result.
    """

    __slots__ = ("token_ids", "eos_token_id", "template")

    def __init__(self, token_ids: Sequence[int], eos_token_id: int) -> None:
        self.token_ids = tuple(token_ids)
        self.eos_token_id = eos_token_id
        self.template = ForceSeqTemplate(self.token_ids, eos_token_id)

    def row_op(self, input_ids: Sequence[int]) -> RowOp:
        n = len(input_ids)
        return ForceToken(self.token_ids[n] if n < len(self.token_ids) else self.eos_token_id)

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        apply_op(self.row_op(input_ids), logits)
