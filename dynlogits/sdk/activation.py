"""Duty 1, activate: the gated entries -> the payload the engine carries with one request.

Engines carry per-request data in different places (vLLM ``SamplingParams.extra_args``, SGLang
``custom_params``, TensorRT-LLM a live object per request), but the payload is always the same
JSON list (``dynlogits.specs.encode_entries``). ``gate`` applies the role rule; ``put_payload``
writes a payload into a mapping and removes one the gate did not produce (a client must never
activate a processor by smuggling the key in).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from dynlogits.roles import DisaggregationMode, logits_processors_for_request
from dynlogits.specs import WIRE_KEY, LogitsProcessorSpec, encode_entries

__all__ = ["encode_payload", "gate", "put_payload"]


def gate(spec: LogitsProcessorSpec | None, role: DisaggregationMode | str) -> list[Any]:
    """The entries a worker of ``role`` activates: all of them on agg/decode, none on prefill/encode
    (unless ``spec.generation_only`` is false)."""
    return logits_processors_for_request(spec, disaggregation_mode=DisaggregationMode(role))


def encode_payload(entries: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The wire payload for ``entries``, or ``None`` when there are none (nothing to carry)."""
    return encode_entries(entries) if entries else None


def put_payload(carrier: MutableMapping[str, Any], entries: Sequence[Any], *, key: str = WIRE_KEY) -> list[dict[str, Any]] | None:
    """Set ``carrier[key]`` to exactly the encoded ``entries`` and return that payload.

    With no entries any ``carrier[key]`` already present is removed and ``None`` returned: only the
    gate decides what runs.
    """
    payload = encode_payload(entries)
    if payload is None:
        carrier.pop(key, None)
    else:
        carrier[key] = payload
    return payload
