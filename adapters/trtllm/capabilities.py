"""What the TensorRT-LLM adapter cannot do on a given configuration, said up front.

The PyTorch backend's overlap scheduler (on unless ``disable_overlap_scheduler=True``) calls logits
processors one step behind: ``token_ids`` does not yet hold the previous iteration's token
(TensorRT-LLM PR 16785), and nothing else the callback receives tells how many tokens the request
has generated. Positions derived from ``token_ids`` would then repeat a forced token, so
``check_llm_args`` refuses that combination; run with ``disable_overlap_scheduler=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["UnsupportedEngineConfig", "check_llm_args"]


class UnsupportedEngineConfig(ValueError):
    """The TensorRT-LLM configuration cannot run dynamo logits processors; the message says why."""


def _get(args: Any, name: str, default: Any = None) -> Any:
    return args.get(name, default) if isinstance(args, Mapping) else getattr(args, name, default)


def check_llm_args(llm_args: Any) -> None:
    """Raise ``UnsupportedEngineConfig`` for ``LLM`` arguments (an ``LlmArgs`` or kwargs mapping)
    under which processors would see stale histories."""
    backend = _get(llm_args, "backend", "pytorch")
    if backend in (None, "pytorch", "_autodeploy") and not _get(llm_args, "disable_overlap_scheduler", False):
        raise UnsupportedEngineConfig(
            "dynamo logits processors need disable_overlap_scheduler=True on TensorRT-LLM's PyTorch backend: its "
            "overlap scheduler hands processors token_ids one step behind, so a forced sequence would repeat a token")
