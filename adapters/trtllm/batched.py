"""``DynamoTrtllmBatchedLogitsProcessor``: the TensorRT backend's batched callback on the SDK.

TensorRT-LLM's ``BatchedLogitsProcessor`` (``tensorrt_llm/sampling_params.py``) is one object for
the whole engine (``LLM(batched_logits_processor=...)`` / the executor config), called once per
step with every request that opted in (``SamplingParams.apply_batched_logits_processor=True``):
``(req_ids, logits: list[[beam, 1, vocab]], token_ids: list[per-beam lists], stream_ptr,
client_ids) -> None``, in place, on the CUDA stream ``stream_ptr``.

The callback receives no per-request data, so each request's ``DynamoTrtllmLogitsProcessor`` is
**registered** under the ``client_id`` its executor request carries (``register`` before the
request is enqueued, ``unregister`` when it ends; at most ``max_requests`` are held, oldest dropped
with a warning). Rows of requests that are not registered are left untouched.

Each call gathers the rows of every registered request into one ``[rows, vocab]`` tensor, applies
them all with one ``dynlogits.sdk.apply_rows`` (the SDK's batched path: a few tensor ops per step
for the built-in kinds) and copies each request's rows back into its tensor. A request whose rows
cannot be read (a beam count that does not match its token lists) is fail-stopped alone; nothing
raises out of the call (TensorRT-LLM would fail every active request).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from dynlogits import sdk

from .processor import BatchedLogitsProcessorBase, DynamoTrtllmLogitsProcessor, logits_rows, on_stream

__all__ = ["DynamoTrtllmBatchedLogitsProcessor"]

logger = logging.getLogger("dynlogits.adapters.trtllm")


class DynamoTrtllmBatchedLogitsProcessor(BatchedLogitsProcessorBase):  # type: ignore[misc,valid-type]
    """One per engine; see the module docstring."""

    def __init__(self, max_requests: int = 65536) -> None:
        self.max_requests = max_requests
        self._processors: OrderedDict[int, DynamoTrtllmLogitsProcessor] = OrderedDict()

    def register(self, client_id: int, processor: DynamoTrtllmLogitsProcessor) -> None:
        """Apply ``processor`` to the request enqueued with ``client_id``."""
        self._processors[client_id] = processor
        self._processors.move_to_end(client_id)
        while len(self._processors) > self.max_requests:
            dropped, _ = self._processors.popitem(last=False)
            logger.warning("batched logits processor holds more than %d requests; dropped client id %s (never "
                           "unregistered?)", self.max_requests, dropped)

    def unregister(self, client_id: int) -> None:
        """The request ended: forget it (no-op when unknown)."""
        self._processors.pop(client_id, None)

    def __len__(self) -> int:
        return len(self._processors)

    def __call__(self, req_ids: Sequence[int], logits: Sequence[torch.Tensor], token_ids: Sequence[Sequence[Sequence[int]]],
                 stream_ptr: int | None, client_ids: Sequence[int | None]) -> None:
        views: list[torch.Tensor] = []
        requests: list[Any] = []
        histories: list[list[int]] = []
        for i, req_id in enumerate(req_ids):
            key = client_ids[i] if client_ids and client_ids[i] is not None else req_id
            processor = self._processors.get(key)
            if processor is None:
                continue
            rows: torch.Tensor | None = None
            try:
                rows = logits_rows(logits[i])
                request = processor.request(int(rows.shape[-1]))
                if request is None:
                    continue
                beams = processor.histories(token_ids[i], int(rows.shape[0]))
            except Exception as exc:  # this request alone
                with on_stream(stream_ptr, logits[i]):
                    processor.fail_stop(rows, exc)
                continue
            views.append(rows)
            requests += [request] * rows.shape[0]
            histories += beams
        if not views:
            return
        with on_stream(stream_ptr, views[0]):
            gathered = torch.cat(views) if len(views) > 1 else views[0]
            sdk.apply_rows(gathered, list(range(gathered.shape[0])), requests, histories)
            if len(views) > 1:
                start = 0
                for view in views:
                    view.copy_(gathered[start:start + view.shape[0]])
                    start += view.shape[0]
