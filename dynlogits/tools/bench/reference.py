"""The reference for the benchmarks: ai-dynamo-runtime 1.6.1's forced-sequence processor in vLLM.

ai-dynamo 1.6.1 ships ``ForcedSequenceLogitsProcessor`` but no vLLM-side reader of
``extra_args["dynamo_logits"]``; ``ReferenceForcedSequenceProcessor`` is the thinnest one, on vLLM's
``AdapterLogitsProcessor``: one reference processor per ``forced_sequence`` entry, called per row.
Load it with ``LLM(model, logits_processors=[REFERENCE_FQCN])``: V1 runner and ``forced_sequence``
only (``validate_params`` rejects other kinds, naming the entry). Measured, never copied."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from dynlogits.specs import WIRE_KEY

__all__ = ["REFERENCE_FQCN", "ReferenceForcedSequenceProcessor", "reference_available"]

#: The import string vLLM's ``logits_processors`` accepts for the reference wrapper.
REFERENCE_FQCN = "dynlogits.tools.bench.reference:ReferenceForcedSequenceProcessor"


def reference_available() -> str | None:
    """``None`` when ai-dynamo-runtime's processor imports, else why it does not."""
    try:
        from dynamo.logits_processing.examples.forced_sequence import ForcedSequenceLogitsProcessor  # noqa: F401
    except ImportError as exc:
        return (f"ai-dynamo-runtime 1.6.1 is not importable ({exc}); scripts/setup-env.sh installs it "
                "with `pip install --no-deps ai-dynamo-runtime==1.6.1`")
    return None


def _forced_entries(params: Any) -> list[dict[str, Any]]:
    """The ``forced_sequence`` entries of a request; ``ValueError`` naming any other entry."""
    payload = (getattr(params, "extra_args", None) or {}).get(WIRE_KEY)
    if payload is None:
        return []
    if not isinstance(payload, list):
        raise ValueError(f"{WIRE_KEY}: must be a list of entries, got {type(payload).__name__}")
    for i, entry in enumerate(payload):
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind != "forced_sequence":
            raise ValueError(f"{WIRE_KEY}[{i}].kind: the reference supports only 'forced_sequence', got {kind!r}")
    return payload


class ReferenceForcedSequenceProcessor(AdapterLogitsProcessor):
    """vLLM V1 processor running ai-dynamo-runtime 1.6.1's ``ForcedSequenceLogitsProcessor`` per row."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        _forced_entries(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        from dynamo.logits_processing.examples.forced_sequence import ForcedSequenceLogitsProcessor

        processors = [ForcedSequenceLogitsProcessor(e["token_ids"], e["eos_token_id"]) for e in _forced_entries(params)]
        if not processors:
            return None

        def apply(output_ids: Sequence[int], row: torch.Tensor) -> torch.Tensor:
            for processor in processors:
                processor(output_ids, row)
            return row

        return apply
