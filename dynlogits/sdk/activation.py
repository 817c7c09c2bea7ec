"""Duty 1, activate: the gated entries -> the payload the engine carries with one request.

The payload is always the same JSON list (``dynlogits.specs.encode_entries``), wherever the engine
carries it. ``gate`` applies the role rule; ``put_payload`` writes a payload into a mapping and
removes one the gate did not produce; ``activate_logits_processors`` writes into an ``extra_args``
mapping (the wire contract's carrier, vLLM ``SamplingParams``). Beside the payload the carrier holds
the request's arrival (``ARRIVAL_KEY``), written only by activation (``put_arrival``) and read by the
engine's adapter (``carried_arrival``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from dynlogits.policy.roles import DisaggregationMode, logits_processors_for_request
from dynlogits.specs import ARRIVAL_KEY, WIRE_KEY, LogitsProcessorSpec, encode_entries

__all__ = ["activate_logits_processors", "carried_arrival", "encode_payload", "gate", "put_arrival", "put_payload"]


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


def put_arrival(carrier: MutableMapping[str, Any], arrival_time: float | None) -> None:
    """Set ``carrier[ARRIVAL_KEY]`` to ``arrival_time`` (``time.time()`` when the deployment received
    the request), or remove it with ``None``: a client never chooses its request's arrival."""
    if arrival_time is None:
        carrier.pop(ARRIVAL_KEY, None)
    else:
        carrier[ARRIVAL_KEY] = float(arrival_time)


def carried_arrival(carrier: Mapping[str, Any] | None) -> float | None:
    """The arrival ``carrier`` holds under ``ARRIVAL_KEY``; ``None`` when absent or not a finite number
    (the request then counts from its realization)."""
    value = carrier.get(ARRIVAL_KEY) if isinstance(carrier, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def activate_logits_processors(target: Any, entries: Sequence[Any], *,
                               arrival_time: float | None = None) -> MutableMapping[str, Any] | None:
    """Set ``extra_args["dynamo_logits"]`` on ``target`` to exactly ``entries`` (wire entries,
    ``forced_text`` resolved), and ``extra_args[ARRIVAL_KEY]`` to ``arrival_time`` beside them.

    ``target``: an ``extra_args`` mapping or an object with an ``extra_args`` attribute (``None``
    there becomes a new dict when needed). With no entries an existing ``dynamo_logits`` is removed,
    and an arrival with it, as is any arrival not given here (``put_arrival``).
    Returns the mapping written, or ``None`` when ``target`` had no ``extra_args`` and none was needed."""
    extra: MutableMapping[str, Any] | None
    extra = target if isinstance(target, MutableMapping) else getattr(target, "extra_args", None)
    if extra is None:
        if not entries:
            return None
        extra = {}
        target.extra_args = extra
    put_payload(extra, entries)
    put_arrival(extra, arrival_time if entries else None)
    return extra
