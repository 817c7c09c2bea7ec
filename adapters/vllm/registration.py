"""Installing the adapter into a vLLM engine's arguments.

``register_dynamo_logits_processor(engine_args)`` adds the class by import string to
``logits_processors`` (the front end, engine core and workers each import it), idempotently,
keeping the user's other processors in order, and rejects configurations that certainly cannot
work (``capabilities``). By hand: ``--logits-processors dynlogits.adapters.vllm:DynamoVllmLogitsProcessor``."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, TypeVar

from .capabilities import check_engine_args
from .processor import DynamoVllmLogitsProcessor

__all__ = ["PROCESSOR_FQCN", "is_dynamo_processor", "register_dynamo_logits_processor"]

#: The import string vLLM's ``--logits-processors`` accepts for the adapter.
PROCESSOR_FQCN = "dynlogits.adapters.vllm:DynamoVllmLogitsProcessor"
_ALIASES = frozenset({PROCESSOR_FQCN, "dynlogits.adapters.vllm.processor:DynamoVllmLogitsProcessor"})

T = TypeVar("T")


def is_dynamo_processor(entry: object) -> bool:
    """Whether a ``logits_processors`` entry (class or import string) is this adapter."""
    if isinstance(entry, str):
        return entry in _ALIASES
    return isinstance(entry, type) and issubclass(entry, DynamoVllmLogitsProcessor)


def register_dynamo_logits_processor(engine_args: T) -> T:
    """Add the adapter to ``engine_args.logits_processors`` (or ``engine_args["logits_processors"]``
    for an ``LLM(**kwargs)`` mapping) unless it is there; returns ``engine_args``. Raises
    ``UnsupportedEngineConfig`` for pooling models, and for speculative decoding when the V1 runner
    will certainly run."""
    check_engine_args(engine_args)
    is_mapping = isinstance(engine_args, MutableMapping)
    target: Any = engine_args  # a mapping or an EngineArgs-like object, told apart at run time
    current: Any = target.get("logits_processors") if is_mapping else target.logits_processors
    processors = list(current or [])
    if not any(is_dynamo_processor(p) for p in processors):
        processors.append(PROCESSOR_FQCN)
    if is_mapping:
        target["logits_processors"] = processors
    else:
        target.logits_processors = processors
    return engine_args
