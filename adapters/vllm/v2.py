"""The Model Runner V2 half of the adapter (``vllm.v1.worker.gpu.sample.logits_processor``).

V2 contract (vLLM >= 0.31): requests live in persistent *slots* that are recycled without a
removal call, so ``add_request(slot, params)`` overwrites all of the slot's state and returns
whether the request needs us. ``apply(logits, ctx)`` runs once per step for the whole batch;
``ctx.expanded_idx_mapping`` maps each logits row to its slot, and under speculative decoding a
request owns one row per draft token. Committed tokens come from the runner's request state
(``all_token_ids[slot, prompt_len:total_len]``); the drafts preceding a row are only in
``ctx.input_ids`` (local position 0 holds the last committed token, drafts start at 1), exactly
as vLLM's own bad-words kernel reads them. Resumption after preemption needs nothing special:
``all_token_ids`` holds every committed output token again.

Cost: nothing is read back from the device unless a request in this step carries a payload;
then one small gather of the active slots' lengths and tokens per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dynlogits.sdk import apply_rows

from .request import GuardedRequest

try:  # vLLM >= 0.31; the adapter still works with the V1 runner alone on older versions
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

    HAS_V2_INTERFACE = True
except ImportError:  # pragma: no cover - depends on the installed vLLM
    HAS_V2_INTERFACE = False
    LogitsProcessor = object  # type: ignore[assignment,misc]
    LogitsContext = LogitsProcRequestState = None  # type: ignore[assignment,misc]

__all__ = ["HAS_V2_INTERFACE", "V2RunnerMixin", "row_histories"]


def row_histories(
    req_states: Any, ctx: Any, rows: np.ndarray, slots: np.ndarray
) -> list[list[int]]:
    """The generated tokens visible to each of ``rows`` (whose slots are ``slots``).

    ``req_states`` is a ``LogitsProcRequestState``: ``all_token_ids.gpu`` ``[max_reqs, max_len]``,
    ``total_len.gpu`` ``[max_reqs]`` (device), ``prompt_len.np`` ``[max_reqs]`` (host).
    """
    unique = np.unique(slots)
    index = torch.from_numpy(unique.astype(np.int64)).to(req_states.all_token_ids.gpu.device)
    total = req_states.total_len.gpu[index].cpu().numpy()
    prompt = np.asarray(req_states.prompt_len.np)[unique]
    width = int(total.max())
    tokens = req_states.all_token_ids.gpu[index, :width].cpu().numpy()
    committed = {int(s): tokens[i, prompt[i] : total[i]].tolist() for i, s in enumerate(unique)}

    one_row_per_request = ctx.expanded_idx_mapping.shape[0] == len(ctx.idx_mapping_np)
    if one_row_per_request:
        return [committed[int(s)] for s in slots]
    local = ctx.expanded_local_pos.cpu().numpy()
    inputs = ctx.input_ids.cpu().numpy()
    histories: list[list[int]] = []
    for row, slot in zip(rows.tolist(), slots.tolist()):
        k = int(local[row])
        drafts = inputs[row - k + 1 : row + 1].tolist() if k else []
        histories.append(committed[slot] + drafts)
    return histories


class V2RunnerMixin(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Model Runner V2 behaviour; the public class combines it with the V1 half (see ``processor``)."""

    new_req_logits_processor: Any  # shared realization, defined by the public class

    def _init_v2_state(self, req_states: Any) -> None:
        self._req_states = req_states
        self._slots: list[GuardedRequest | None] = [None] * req_states.max_num_reqs
        self._active = np.zeros(req_states.max_num_reqs, dtype=bool)

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Reset slot ``req_idx`` for a new occupant; True when it carries a payload."""
        request = self.new_req_logits_processor(sampling_params)
        self._slots[req_idx] = request
        self._active[req_idx] = request is not None
        return request is not None

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if not self._active[ctx.idx_mapping_np].any():
            return logits  # no request of this step carries a payload: no device reads at all
        row_slots = ctx.expanded_idx_mapping.cpu().numpy()
        rows = np.flatnonzero(self._active[row_slots])
        slots = row_slots[rows]
        histories = row_histories(self._req_states, ctx, rows, slots)
        requests = [self._slots[int(s)] for s in slots]
        apply_rows(logits, rows.tolist(), requests, histories)  # type: ignore[arg-type]
        return logits
