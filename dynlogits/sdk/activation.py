"""Duty 1, activate: the gated entries -> the payload the engine carries with one request.

The payload is always the same JSON list (``dynlogits.specs.encode_entries``), wherever the engine
carries it. ``gate`` applies the role rule; ``put_payload`` writes a payload into a mapping and
removes one the gate did not produce; ``activate_logits_processors`` writes into an ``extra_args``
mapping (the wire contract's carrier, vLLM ``SamplingParams``)."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from dynlogits.policy.roles import DisaggregationMode, logits_processors_for_request
from dynlogits.specs import WIRE_KEY, LogitsProcessorSpec, encode_entries

__all__ = ["activate_logits_processors", "encode_payload", "gate", "put_payload"]


def gate(spec: LogitsProcessorSpec | None, role: DisaggregationMode | str) -> list[Any]:
    """The entries a worker of ``role`` activates: all of them on agg/decode, none on prefill/encode
    (unless ``spec.generation_only`` is false)."""
    return logits_processors_for_request(spec, disaggregation_mode=DisaggregationMode(role))


def encode_payload(entries: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The wire payload for ``entries``, or ``None`` when there are none (nothing to carry)."""
    return encode_entries(entries) if entries else None


def put_payload(carrier: MutableMapping[str, Any], entries: Sequence[Any], *, key: str = WIRE_KEY) -> list[dict[str, Any]] | None:
    """Set ``carrier[key]`` to exactly the encoded ``entries`` and return that payload; with no entries
    remove any ``carrier[key]`` and return ``None`` (only the gate decides what runs)."""
    payload = encode_payload(entries)
    if payload is None:
        carrier.pop(key, None)
    else:
        carrier[key] = payload
    return payload


def activate_logits_processors(target: Any, entries: Sequence[Any]) -> MutableMapping[str, Any] | None:
    """Set ``extra_args["dynamo_logits"]`` on ``target`` to exactly ``entries`` (wire entries,
    ``forced_text`` resolved).

    ``target``: an ``extra_args`` mapping or an object with an ``extra_args`` attribute (``None``
    there becomes a new dict when needed). With no entries an existing ``dynamo_logits`` is removed.
    Returns the mapping written, or ``None`` when ``target`` had no ``extra_args`` and none was needed."""
    extra: MutableMapping[str, Any] | None
    extra = target if isinstance(target, MutableMapping) else getattr(target, "extra_args", None)
    if extra is None:
        if not entries:
            return None
        extra = {}
        target.extra_args = extra
    put_payload(extra, entries)
    return extra
