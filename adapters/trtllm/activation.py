"""Worker side: a fresh ``DynamoTrtllmLogitsProcessor`` per request, on its ``SamplingParams``.

TensorRT-LLM takes live processor objects on ``SamplingParams.logits_processor`` (a list on the
PyTorch backend only; the TensorRT backend's request binding takes one callable). ``activate``
validates the gated entries and replaces the processor of ours a previous call attached, keeping
any others; ``validate(sampling_params)`` re-checks the payload of every processor of ours on a
request (admission). Positions count from the prompt the engine holds at the first call, so
``activate`` needs no prompt, only ``generated_before`` for a request that arrives mid-generation;
it stamps the request's arrival on the processor (the facts: ``processor``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dynlogits import sdk

from .processor import DynamoTrtllmLogitsProcessor, stop_token

__all__ = ["BOTH_CALLBACKS", "activate", "stop_token", "validate"]

#: Why a request that opted into the batched callback cannot also get a per-request processor.
BOTH_CALLBACKS = (
    "sampling_params.apply_batched_logits_processor is set: TensorRT-LLM's TensorRT backend runs a request's own "
    "logits processor or the batched one, never both (LogitsPostProcessor), so a per-request processor would "
    "silently take the batched processor's place; register the request with DynamoTrtllmBatchedLogitsProcessor "
    "instead, or clear the flag"
)


def _attached(current: Any) -> list[Any]:
    return current if isinstance(current, list) else ([] if current is None else [current])


def _others(current: Any) -> list[Any]:
    return [p for p in _attached(current) if not isinstance(p, DynamoTrtllmLogitsProcessor)]


def _ours(current: Any) -> list[DynamoTrtllmLogitsProcessor]:
    return [p for p in _attached(current) if isinstance(p, DynamoTrtllmLogitsProcessor)]


def activate(sampling_params: Any, entries: Sequence[Any], *, vocab_size: int | None = None,
             generated_before: int = 0, arrival_time: float | None = None) -> DynamoTrtllmLogitsProcessor | None:
    """Attach a fresh processor for ``entries`` to ``sampling_params`` (anything with a
    ``logits_processor`` attribute) and return it; ``None`` without entries (ours is then removed).
    Raises ``SpecError`` naming the field (``python`` only when allow-listed), ``ValueError`` when
    the request opted into the batched callback. ``vocab_size``: the logits width, when known;
    ``generated_before``: tokens generated before this engine (a disaggregated decode worker's);
    ``arrival_time``: when the deployment received the request (default: now, ``time.time()``)."""
    payload = sdk.encode_payload(entries)
    sdk.validate(payload, vocab_size=vocab_size)
    if payload is not None and getattr(sampling_params, "apply_batched_logits_processor", False):
        raise ValueError(BOTH_CALLBACKS)
    others = _others(getattr(sampling_params, "logits_processor", None))
    if payload is None:
        sampling_params.logits_processor = others if len(others) > 1 else (others[0] if others else None)
        return None
    processor = DynamoTrtllmLogitsProcessor(payload, sampling_params=sampling_params, generated_before=generated_before,
                                            vocab_size=vocab_size,
                                            arrival_time=time.time() if arrival_time is None else arrival_time)
    sampling_params.logits_processor = [*others, processor] if others else processor
    return processor


def validate(sampling_params: Any, *, vocab_size: int | None = None) -> None:
    """Raise ``SpecError`` naming the field unless every processor of ours on ``sampling_params``
    carries a payload that would realize (``vocab_size``, when known, bounds every id)."""
    for processor in _ours(getattr(sampling_params, "logits_processor", None)):
        sdk.validate(processor.payload, vocab_size=vocab_size)
