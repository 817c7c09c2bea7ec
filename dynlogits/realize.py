"""Engine side: a wire payload -> fresh, validated per-request processors.

Every adapter calls this module, so every engine validates and realizes a payload
the same way. The payload is untrusted: all checks run here before any code runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dynlogits.processors import BaseLogitsProcessor, RealizeContext
from dynlogits.processors.ops import ROW_OPS, check_op
from dynlogits.registry import check_python_allowed, factory_for
from dynlogits.specs import DEFAULT_LIMITS, WIRE_KEY, SpecError, SpecLimits, decode_wire_payload

__all__ = ["RequestLogitsProcessor", "build_request_processor", "decode_payload", "validate_payload"]


class RequestLogitsProcessor:
    """All processors of one request, applied in payload order, in place.

    ``__call__(output_ids, logits_row)``: ``output_ids`` are the tokens the request
    generated so far, ``logits_row`` its 1-D logits row. With ``vocab_size`` (the logits width)
    every planned row op is bounds-checked (``check_op``): an op naming an id outside the row
    raises ``IndexError`` from ``plan``, which fails this request only.
    """

    __slots__ = ("processors", "vocab_size")

    def __init__(self, processors: Sequence[BaseLogitsProcessor], vocab_size: int | None = None) -> None:
        self.processors = tuple(processors)
        self.vocab_size = vocab_size

    def __call__(self, output_ids: Sequence[int], logits_row: torch.Tensor) -> None:
        for processor in self.processors:
            processor(output_ids, logits_row)

    def plan(self, output_ids: Sequence[int]) -> list[Any]:
        """This step's work for ``dynlogits.batch.apply_plans``, in payload order: a ``RowOp`` per
        built-in processor that acts now, the processor itself for any other kind."""
        steps: list[Any] = []
        for processor in self.processors:
            row_op = getattr(processor, "row_op", None)
            if row_op is None:
                steps.append(processor)
                continue
            op = row_op(output_ids)
            if op is not None and not isinstance(op, ROW_OPS):
                raise TypeError(f"{type(processor).__name__}.row_op returned {type(op).__name__}, not a RowOp or None")
            if op is not None:
                if self.vocab_size is not None:
                    check_op(op, self.vocab_size)
                steps.append(op)
        return steps

    def __repr__(self) -> str:
        return f"RequestLogitsProcessor({', '.join(type(p).__name__ for p in self.processors)})"


def decode_payload(
    payload: Any,
    *,
    vocab_size: int | None = None,
    limits: SpecLimits = DEFAULT_LIMITS,
    environ: Mapping[str, str] = os.environ,
) -> tuple[Any, ...]:
    """Validate a payload into entries (``SpecError`` naming the field on any problem).

    ``decode_wire_payload`` checks every entry, built-in or of a plug-in kind in force
    (by its own model); ``python`` entries pass only when allow-listed here.
    """
    if payload is None:
        return ()
    entries = decode_wire_payload(payload, limits=limits, vocab_size=vocab_size)
    for i, entry in enumerate(entries):
        if entry.kind == "python":
            check_python_allowed(entry.factory, path=f"{WIRE_KEY}[{i}].factory", environ=environ)
    return entries


def validate_payload(payload: Any, *, vocab_size: int | None = None, limits: SpecLimits = DEFAULT_LIMITS) -> None:
    """Admission check: everything ``build_request_processor`` checks, without realizing."""
    decode_payload(payload, vocab_size=vocab_size, limits=limits)


def build_request_processor(
    payload: Any, *, vocab_size: int, limits: SpecLimits = DEFAULT_LIMITS
) -> RequestLogitsProcessor | None:
    """Fresh processors for one request, or ``None`` when the payload is absent or empty."""
    entries = decode_payload(payload, vocab_size=vocab_size, limits=limits)
    if not entries:
        return None
    ctx = RealizeContext(vocab_size=vocab_size)
    processors: list[BaseLogitsProcessor] = []
    for i, entry in enumerate(entries):
        try:
            processors.append(factory_for(entry.kind)(entry, ctx))
        except SpecError:
            raise
        except Exception as exc:  # a third-party factory failed: fail this request, loudly
            raise SpecError.single(f"{WIRE_KEY}[{i}]", f"could not realize kind {entry.kind!r}: {type(exc).__name__}: {exc}") from exc
    return RequestLogitsProcessor(processors, vocab_size=vocab_size)
