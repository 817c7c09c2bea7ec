"""Disaggregation roles and the gate that keeps processors off non-generating workers."""

from __future__ import annotations

from enum import Enum

from dynlogits.specs import Entry, LogitsProcessorSpec

__all__ = ["DisaggregationMode", "is_generation_stage", "logits_processors_for_request"]


class DisaggregationMode(str, Enum):
    """What a worker does with a request. Values are the CLI spellings."""

    AGGREGATED = "agg"
    PREFILL = "prefill"
    DECODE = "decode"
    ENCODE = "encode"


_GENERATION_STAGES = frozenset({DisaggregationMode.AGGREGATED, DisaggregationMode.DECODE})


def is_generation_stage(mode: DisaggregationMode) -> bool:
    """True for the roles that emit the visible token stream (agg, decode)."""
    return DisaggregationMode(mode) in _GENERATION_STAGES


def logits_processors_for_request(
    spec: LogitsProcessorSpec | None, *, disaggregation_mode: DisaggregationMode
) -> list[Entry]:
    """The entries a worker of this role realizes for one request.

    Empty when there is no spec, or when ``spec.generation_only`` and the role
    does not generate (prefill, encode).
    """
    if spec is None:
        return []
    if spec.generation_only and not is_generation_stage(disaggregation_mode):
        return []
    return list(spec.entries)
