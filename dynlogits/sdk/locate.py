"""Duty 3, locate: where a logits row's request, position and history come from.

The contract every adapter meets: for each row it processes, it names the row's request and that
request's *history*, the tokens the request generated so far, in order, without the prompt,
followed by any draft tokens that precede this row under speculative decoding. Processors derive
their position from ``len(history)`` (never from a private step counter), so the same history
always gives the same effect: a preempted or recomputed request resumes exactly, and several rows
of one request (beams, samples, drafts) are independent.

Where each engine keeps it:

=================  ==========================================================================
engine             history of a row
=================  ==========================================================================
vLLM V1 runner     the live ``output_token_ids`` list handed over in ``BatchUpdate.added``
vLLM Model         ``all_token_ids[slot, prompt_len[slot]:total_len[slot]]`` plus the drafts
Runner V2          before the row (``ctx.input_ids``, local positions ``1..k``)
transformers       ``input_ids[row, prompt_width:]`` (``generate()`` left-pads prompts to one
                   width; beams and returned sequences are rows of their prompt's request)
SGLang             ``Req.output_ids`` (lags one token under the overlap scheduler)
TensorRT-LLM       ``token_ids[0][prompt_len:]`` (prompt and generated tokens in one list)
=================  ==========================================================================

``histories_from_ids`` is the one helper the dense layouts share: one host copy of the token
matrix per step, then per-row slices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["histories_from_ids"]


def histories_from_ids(token_ids: torch.Tensor, starts: Sequence[int], rows: Sequence[int] | None = None) -> list[list[int]]:
    """``token_ids[r, starts[i]:]`` for each selected row ``r = rows[i]`` (all rows when ``rows`` is
    ``None``), as Python lists, with one device-to-host copy for the whole matrix.

    ``token_ids`` is ``[num_rows, seq_len]`` (prompt then generated tokens, left-padded);
    ``starts[i]`` is where generation began in that row.
    """
    selected = list(range(token_ids.shape[0])) if rows is None else list(rows)
    if len(starts) != len(selected):
        raise ValueError(f"starts has {len(starts)} entries for {len(selected)} rows")
    host = token_ids.detach().to("cpu").tolist()
    return [host[r][s:] for r, s in zip(selected, starts)]
