"""``DynamoTrtllmBatchedLogitsProcessor``: the TensorRT backend's batched callback, for the executor
API driven in this process only.

TensorRT-LLM calls one batched object per engine (``ExecutorConfig.logits_post_processor_config``)
once per step with every opted-in request, ``(req_ids, logits, token_ids, stream_ptr, client_ids)``;
a request with its own processor is never in that batch (``LogitsPostProcessor::operator()``).
The call carries no per-request data, so each request's ``DynamoTrtllmLogitsProcessor`` is
registered under its client id (``register`` before ``enqueue_request``, ``unregister`` at the end;
at most ``max_requests``, oldest dropped with a warning).

Not through the LLM API (it pickles the object into the executor and assigns client ids inside
``generate_async``): pickling raises ``TypeError`` and ``check_llm_args`` refuses it. An opted-in
request without a registered processor is fail-stopped and reported once; nothing raises out."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NoReturn

import torch

from dynlogits import sdk
from dynlogits.sdk import GuardedRequest

from .processor import FAILURES, BatchedLogitsProcessorBase, DynamoTrtllmLogitsProcessor, on_stream

__all__ = ["NOT_THROUGH_LLM_API", "DynamoTrtllmBatchedLogitsProcessor"]

logger = logging.getLogger("dynlogits.adapters.trtllm")

#: Why the batched processor cannot cross a process boundary (TensorRT-LLM's LLM API).
NOT_THROUGH_LLM_API = (
    "DynamoTrtllmBatchedLogitsProcessor cannot be used through TensorRT-LLM's LLM API: the LLM pickles "
    "batched_logits_processor into its executor worker, where register() calls made on the caller's copy never "
    "arrive, and it assigns client ids inside generate_async, after a caller could register them. Attach a "
    "per-request processor with dynlogits.adapters.trtllm.activate() instead, or use the batched processor with "
    "the executor API (tensorrt_llm.bindings.executor) in this process."
)


class DynamoTrtllmBatchedLogitsProcessor(BatchedLogitsProcessorBase):
    """One per engine; see the module docstring. ``stop_token_id`` (the model's EOS) ends an
    opted-in request that has no registered processor (``None``: it is reported and continues)."""

    def __init__(self, *, stop_token_id: int | None, max_requests: int = 65536) -> None:
        self.stop_token_id = stop_token_id
        self.max_requests = max_requests
        self._processors: OrderedDict[int, DynamoTrtllmLogitsProcessor] = OrderedDict()
        self._strays: OrderedDict[Any, GuardedRequest] = OrderedDict()

    def __getstate__(self) -> NoReturn:
        raise TypeError(NOT_THROUGH_LLM_API)

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
        self._strays.pop(client_id, None)

    def __len__(self) -> int:
        return len(self._processors)

    def __call__(self, req_ids: Sequence[int], logits: Sequence[torch.Tensor], token_ids: Sequence[Sequence[Sequence[int]]],
                 stream_ptr: int | None, client_ids: Sequence[int | None]) -> None:
        try:
            sdk.drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
            count = len(logits)
        except Exception:
            logger.exception("batched logits processor: TensorRT-LLM's call could not be read; no row was processed")
            return
        for i in range(count):
            processor: DynamoTrtllmLogitsProcessor | None = None
            tensor: Any = None
            stray: Any = None  # what a stray is known by: its client id, else its request id
            key: Any = None
            try:
                tensor = logits[i]
                stray = ("request", req_ids[i])
                key = client_ids[i]
                stray = key if key is not None else stray
                processor = self._processors.get(key) if key is not None else None
                if processor is None:
                    self._stop_stray(stray, key, tensor, stream_ptr)
                    continue
                processor(req_ids[i], tensor, token_ids[i], stream_ptr, key)
            except Exception as exc:  # a read of this request failed: it alone fails
                if processor is not None:
                    processor.fail_stop(tensor, stream_ptr, exc)
                else:
                    self._stop_stray(stray, key, tensor, stream_ptr, exc)

    def _stop_stray(self, stray_key: Any, key: Any, logits: Any, stream_ptr: int | None,
                    exc: Exception | None = None) -> None:
        """An opted-in request this processor cannot place: reported once (per ``stray_key``: its
        client id, else its request id; every step when neither could be read), its rows masked to
        ``stop_token_id``. Never raises."""
        try:
            stray = self._strays.get(stray_key) if stray_key is not None else None
            if stray is None:
                why = (f"could not be read: {type(exc).__name__}: {exc}" if exc is not None else
                       "carries no client id" if key is None else
                       f"opted in with client id {key}, but no processor was registered for it")
                stray = GuardedRequest.failed_at_realization(f"a request in the batched logits processor {why}",
                                                             stop_token_id=self.stop_token_id, report=FAILURES.append)
                if stray_key is not None:
                    self._strays[stray_key] = stray
                    while len(self._strays) > self.max_requests:
                        self._strays.popitem(last=False)
            if isinstance(logits, torch.Tensor) and logits.ndim and self.stop_token_id is not None \
                    and 0 <= self.stop_token_id < logits.shape[-1]:
                with on_stream(stream_ptr, logits):
                    stray.force_stop(logits)
        except Exception:
            logger.exception("batched logits processor: could not fail-stop an unplaceable request")
