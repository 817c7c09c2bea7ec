"""Engine side: a wire payload -> fresh, validated per-request processors.

Every adapter calls this module, so every engine validates and realizes a payload
the same way. The payload is untrusted: all checks run here before any code runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from pydantic import ValidationError

from dynlogits.processors import BaseLogitsProcessor, RealizeContext
from dynlogits.processors.ops import ROW_OPS
from dynlogits.registry import check_python_allowed, factory_for, plugin_kinds
from dynlogits.specs import DEFAULT_LIMITS, WIRE_KEY, SpecError, SpecLimits, check_vocab, decode_wire_payload
from dynlogits.specs.errors import problems_from_pydantic
from dynlogits.specs.wire import decode_wire_entry

__all__ = ["RequestLogitsProcessor", "build_request_processor", "decode_payload", "validate_payload"]


class RequestLogitsProcessor:
    """All processors of one request, applied in payload order, in place.

    ``__call__(output_ids, logits_row)``: ``output_ids`` are the tokens the request
    generated so far, ``logits_row`` its 1-D logits row.
    """

    __slots__ = ("processors",)

    def __init__(self, processors: Sequence[BaseLogitsProcessor]) -> None:
        self.processors = tuple(processors)

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
                steps.append(op)
        return steps

    def __repr__(self) -> str:
        return f"RequestLogitsProcessor({', '.join(type(p).__name__ for p in self.processors)})"


def _decode_with_plugins(payload: list[Any], plugins: Mapping[str, Any], limits: SpecLimits, root: str) -> tuple[Any, ...]:
    entries: list[Any] = []
    for i, item in enumerate(payload):
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind in plugins:
            try:
                entries.append(plugins[kind].spec_model.model_validate(item))
            except ValidationError as err:
                raise SpecError(problems_from_pydantic(err.errors(), root=f"{root}[{i}]", tags=frozenset())) from None
        else:
            entries.append(decode_wire_entry(item, path=f"{root}[{i}]", limits=limits))
    return tuple(entries)


def decode_payload(
    payload: Any,
    *,
    vocab_size: int | None = None,
    limits: SpecLimits = DEFAULT_LIMITS,
    environ: Mapping[str, str] = os.environ,
) -> tuple[Any, ...]:
    """Validate a payload into entries (``SpecError`` naming the field on any problem).

    Built-in kinds go through ``decode_wire_payload``; registered third-party kinds
    through their own model; ``python`` entries only when allow-listed here.
    """
    if payload is None:
        return ()
    plugins = plugin_kinds()
    if plugins and isinstance(payload, list) and any(isinstance(i, dict) and i.get("kind") in plugins for i in payload):
        if len(payload) > limits.max_entries:
            raise SpecError.single(WIRE_KEY, f"must have at most {limits.max_entries} entries (limit max_entries)")
        entries = _decode_with_plugins(payload, plugins, limits, WIRE_KEY)
    else:
        entries = decode_wire_payload(payload, limits=limits)
    if vocab_size is not None:
        check_vocab(entries, vocab_size, root=WIRE_KEY)
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
    return RequestLogitsProcessor(processors)
