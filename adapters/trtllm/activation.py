"""Worker side: a fresh ``DynamoTrtllmLogitsProcessor`` per request, on its ``SamplingParams``.

TensorRT-LLM takes live processor objects on ``SamplingParams.logits_processor`` (one or a list;
a list only on the PyTorch backend). ``activate`` validates the gated entries
(``SpecError`` naming the field; ``python`` entries only when allow-listed on this worker, and
again in the engine process), encodes them as the wire payload and puts a new processor for this
request on ``sampling_params``, replacing one a previous call attached and keeping any others.
With no entries it removes ours and attaches nothing. ``validate(sampling_params)`` is the
admission check of what a request carries: the payload of every processor of ours attached to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynlogits import sdk

from .processor import DynamoTrtllmLogitsProcessor

__all__ = ["activate", "stop_token_ids", "validate"]


def stop_token_ids(sampling_params: Any) -> tuple[int, ...]:
    """The ids a failed request is ended with, best first: ``end_id`` (unless ``ignore_eos``),
    then ``stop_token_ids``."""
    ids: list[int] = []
    end_id = getattr(sampling_params, "end_id", None)
    if isinstance(end_id, int) and not getattr(sampling_params, "ignore_eos", False):
        ids.append(end_id)
    ids += sorted(int(t) for t in (getattr(sampling_params, "stop_token_ids", None) or ()))
    return tuple(ids)


def _attached(current: Any) -> list[Any]:
    return current if isinstance(current, list) else ([] if current is None else [current])


def _others(current: Any) -> list[Any]:
    return [p for p in _attached(current) if not isinstance(p, DynamoTrtllmLogitsProcessor)]


def _ours(current: Any) -> list[DynamoTrtllmLogitsProcessor]:
    return [p for p in _attached(current) if isinstance(p, DynamoTrtllmLogitsProcessor)]


def activate(sampling_params: Any, entries: Sequence[Any], prompt_token_ids: Sequence[int], *,
                             vocab_size: int | None = None) -> DynamoTrtllmLogitsProcessor | None:
    """Attach a fresh processor for ``entries`` to ``sampling_params`` (TensorRT-LLM's
    ``SamplingParams`` or anything with a ``logits_processor`` attribute); returns it, or ``None``
    when there are no entries. ``prompt_token_ids`` is the request's prompt (positions count the
    tokens after it); ``vocab_size``, when known, bounds every id (the logits width)."""
    payload = sdk.encode_payload(entries)
    sdk.validate(payload, vocab_size=vocab_size)
    others = _others(getattr(sampling_params, "logits_processor", None))
    if payload is None:
        sampling_params.logits_processor = others if len(others) > 1 else (others[0] if others else None)
        return None
    processor = DynamoTrtllmLogitsProcessor(payload, prompt_len=len(prompt_token_ids),
                                            stop_token_ids=stop_token_ids(sampling_params))
    sampling_params.logits_processor = [*others, processor] if others else processor
    return processor


def validate(sampling_params: Any, *, vocab_size: int | None = None) -> None:
    """Raise ``SpecError`` naming the field unless every processor of ours on ``sampling_params``
    carries a payload that would realize (``vocab_size``, when known, bounds every id)."""
    for processor in _ours(getattr(sampling_params, "logits_processor", None)):
        sdk.validate(processor.payload, vocab_size=vocab_size)
