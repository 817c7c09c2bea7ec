"""Worker side: a fresh ``DynamoTrtllmLogitsProcessor`` per request, on its ``SamplingParams``.

TensorRT-LLM takes live processor objects on ``SamplingParams.logits_processor`` (one or a list;
a list only on the PyTorch backend). ``attach_logits_processors`` validates the gated entries
(``SpecError`` naming the field; ``python`` entries only when allow-listed on this worker, and
again in the engine process), encodes them as the wire payload and puts a new processor for this
request on ``sampling_params``, replacing one a previous call attached and keeping any others.
With no entries it removes ours and attaches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynlogits import sdk

from .processor import DynamoTrtllmLogitsProcessor

__all__ = ["attach_logits_processors", "stop_token_ids"]


def stop_token_ids(sampling_params: Any) -> tuple[int, ...]:
    """The ids a failed request is ended with, best first: ``end_id`` (unless ``ignore_eos``),
    then ``stop_token_ids``."""
    ids: list[int] = []
    end_id = getattr(sampling_params, "end_id", None)
    if isinstance(end_id, int) and not getattr(sampling_params, "ignore_eos", False):
        ids.append(end_id)
    ids += sorted(int(t) for t in (getattr(sampling_params, "stop_token_ids", None) or ()))
    return tuple(ids)


def _others(current: Any) -> list[Any]:
    items = current if isinstance(current, list) else ([] if current is None else [current])
    return [p for p in items if not isinstance(p, DynamoTrtllmLogitsProcessor)]


def attach_logits_processors(sampling_params: Any, entries: Sequence[Any], prompt_token_ids: Sequence[int], *,
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
