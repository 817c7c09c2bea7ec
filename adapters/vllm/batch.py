"""Applying the requests' processors to their rows of a batch's logits.

Both model runners end here, so a vectorized path (one masked op for every row that bans,
allows or biases tokens) has exactly one place to go. Today each row is handed to its request's
processors; a row is a view of ``logits``, so their in-place edits land in the batch tensor
without copies or new vocab-sized tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .request import GuardedRequest

__all__ = ["apply_to_rows"]


def apply_to_rows(
    logits: torch.Tensor,
    rows: Sequence[int],
    requests: Sequence[GuardedRequest],
    histories: Sequence[Sequence[int]],
) -> None:
    """For each ``i``: ``requests[i](histories[i], logits[rows[i]])``, in place.

    ``logits`` is ``[num_rows, vocab]``; the three sequences have equal length; a request may own
    several rows (one per draft token under speculative decoding), each with its own history.
    """
    for row, request, history in zip(rows, requests, histories, strict=True):
        request(history, logits[row])
