"""Duty 3, locate: where a logits row's request, position and history come from.

Every adapter names, for each row, its request and that request's history: the tokens generated so
far, without the prompt, followed by the drafts before this row. Processors take their position
from ``len(history)``, so the same history always gives the same effect (preemption, recomputation,
beams, samples and drafts need nothing special). Where each engine keeps it: docs/engines.md.
``histories_from_ids`` serves dense token matrices (one host copy per step)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["histories_from_ids"]


def histories_from_ids(token_ids: torch.Tensor, starts: Sequence[int], rows: Sequence[int] | None = None) -> list[list[int]]:
    """``token_ids[r, starts[i]:]`` for each row ``r = rows[i]`` (all rows when ``rows`` is ``None``),
    as Python lists, with one device-to-host copy. ``token_ids``: ``[num_rows, seq_len]``, prompt
    then generated tokens; ``starts[i]``: where generation began in that row."""
    selected = list(range(token_ids.shape[0])) if rows is None else list(rows)
    if len(starts) != len(selected):
        raise ValueError(f"starts has {len(starts)} entries for {len(selected)} rows")
    host = token_ids.detach().to("cpu").tolist()
    return [host[r][s:] for r, s in zip(selected, starts)]
