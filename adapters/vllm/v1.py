"""The V1 model runner half of the adapter (``vllm.v1.sample.logits_processor``).

The V1 runner keeps a persistent batch and tells processors about it through ``BatchUpdate``s
(removed -> added -> moved, applied by vLLM's ``process_dict_updates``). Each added request
brings a *live* reference to its output token list, so the history a request's processors see is
always current, including after preemption (the request is re-added with every token it had).

The V1 runner refuses custom processors under speculative decoding and for pooling models; see
``capabilities``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor, BatchUpdate
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from dynlogits.sdk import apply_rows

from .request import GuardedRequest

__all__ = ["V1RunnerMixin"]


class _Entry(NamedTuple):
    request: GuardedRequest
    output_ids: list[int]  # vLLM's live list: grows as the request generates


class V1RunnerMixin(AdapterLogitsProcessor):
    """V1-runner behaviour; the public class combines it with the V2 half (see ``processor``)."""

    def _init_v1_state(self) -> None:
        self._entries: dict[int, _Entry] = {}  # persistent-batch index -> request

    def is_argmax_invariant(self) -> bool:
        """Forcing, banning and biasing all change the argmax, so greedy requests need us too."""
        return False

    def _new_entry(self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> _Entry | None:
        request = self.new_req_logits_processor(params)
        return None if request is None else _Entry(request, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._entries, batch_update, self._new_entry)

    def _apply_v1(self, logits: torch.Tensor) -> torch.Tensor:
        if self._entries:
            rows = list(self._entries)
            entries = [self._entries[r] for r in rows]
            apply_rows(logits, rows, [e.request for e in entries], [e.output_ids for e in entries])
        return logits
