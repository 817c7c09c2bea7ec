"""What the TensorRT-LLM adapter cannot do on a given configuration, said up front.

``check_llm_args`` refuses, with ``UnsupportedEngineConfig`` naming the setting:

* the PyTorch backend's overlap scheduler (unless ``disable_overlap_scheduler=True``): processors
  see ``token_ids`` one step behind (TensorRT-LLM PR 16785);
* speculative decoding (``speculative_config``): draft rows arrive without the draft tokens
  (PyTorch ``_execute_logit_post_processors`` advances one row per beam);
* beam search on a PyTorch backend older than 1.3.0rc29 (one row per request before PR 16010);
* ``batched_logits_processor=DynamoTrtllmBatchedLogitsProcessor(...)`` (see ``batched``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .batched import NOT_THROUGH_LLM_API, DynamoTrtllmBatchedLogitsProcessor

__all__ = ["BEAM_SEARCH_SINCE", "UnsupportedEngineConfig", "check_llm_args"]

#: The TensorRT-LLM version whose PyTorch backend's per-beam processor layout is proven here.
BEAM_SEARCH_SINCE = "1.3.0rc29"


class UnsupportedEngineConfig(ValueError):
    """The TensorRT-LLM configuration cannot run dynamo logits processors; the message says why."""


def _get(args: Any, name: str, default: Any = None) -> Any:
    return args.get(name, default) if isinstance(args, Mapping) else getattr(args, name, default)


def _installed_version() -> str | None:
    """The installed TensorRT-LLM's version from its package metadata (importing it loads its bindings)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorrt_llm")
    except PackageNotFoundError:
        return None


def _older(version: str, than: str) -> bool:
    try:
        from packaging.version import Version
    except ImportError:  # without packaging the version cannot be compared: do not refuse on it
        return False
    return Version(version) < Version(than)


def check_llm_args(llm_args: Any, *, tensorrt_llm_version: str | None = None) -> None:
    """Raise ``UnsupportedEngineConfig`` for ``LLM`` arguments (an ``LlmArgs`` or kwargs mapping)
    under which processors would see stale, misplaced or unplaceable rows. ``tensorrt_llm_version``:
    the engine's version (default: the installed one, when it imports)."""
    backend = _get(llm_args, "backend", "pytorch")
    pytorch = backend in (None, "pytorch", "_autodeploy")
    if pytorch and not _get(llm_args, "disable_overlap_scheduler", False):
        raise UnsupportedEngineConfig(
            "dynamo logits processors need disable_overlap_scheduler=True on TensorRT-LLM's PyTorch backend: its "
            "overlap scheduler hands processors token_ids one step behind, so a forced sequence would repeat a token")
    if _get(llm_args, "speculative_config") is not None:
        raise UnsupportedEngineConfig(
            "dynamo logits processors do not support speculative decoding (speculative_config) on TensorRT-LLM: the "
            "PyTorch backend hands processors one row per beam while a speculative step has 1 + draft rows per "
            "request, and the TensorRT backend passes draft rows without the draft tokens")
    if isinstance(_get(llm_args, "batched_logits_processor"), DynamoTrtllmBatchedLogitsProcessor):
        raise UnsupportedEngineConfig(NOT_THROUGH_LLM_API)
    version = tensorrt_llm_version or _installed_version()
    beams = _get(llm_args, "max_beam_width", 1) or 1
    if pytorch and beams > 1 and version is not None and _older(version, BEAM_SEARCH_SINCE):
        raise UnsupportedEngineConfig(
            f"dynamo logits processors with beam search (max_beam_width={beams}) need TensorRT-LLM >= "
            f"{BEAM_SEARCH_SINCE} on the PyTorch backend; {version} hands processors one row per request "
            "whatever the beam width (fixed by TensorRT-LLM PR 16010)")
