"""What the adapter can and cannot do on a given vLLM configuration, said up front.

Supported: every generating model on either model runner; speculative decoding on Model Runner V2
(one row per draft token). Rejected with ``UnsupportedEngineConfig`` (a ``ValueError``):
speculative decoding on the V1 runner (which refuses custom processors there) and pooling models
(no sampler). ``check_vllm_config`` is authoritative (vLLM has chosen the runner);
``check_engine_args`` predicts from engine arguments and rejects only what is certain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["UnsupportedEngineConfig", "check_engine_args", "check_vllm_config"]

#: Speculative methods vLLM 0.32's Model Runner V2 does not implement (it falls back to V1).
_V1_ONLY_SPEC_METHODS = frozenset({"suffix", "medusa", "mlp_speculator", "custom_class"})
_POOLING_CONVERTS = frozenset({"embed", "classify"})

_SPEC_ON_V1 = (
    "dynamo logits processors cannot run with speculative decoding on vLLM's V1 model runner "
    "(it refuses custom logits processors when speculative decoding is enabled). Use Model Runner V2 "
    "(the default on GPUs with Triton; set VLLM_USE_V2_MODEL_RUNNER=1 and a speculative method it "
    "supports) or disable speculative decoding"
)
_POOLING = "dynamo logits processors need a generating model; pooling models have no sampler ({why})"


class UnsupportedEngineConfig(ValueError):
    """The engine configuration cannot run dynamo logits processors; the message says why."""


def _get(args: Any, name: str) -> Any:
    return args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)


def _spec_method(spec: Any) -> str | None:
    method = _get(spec, "method")
    return method if isinstance(method, str) else None


def _v1_runner_is_certain(spec: Any) -> str | None:
    """Why the V1 runner will run with this speculative config, or None when it may not."""
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    from .v2 import HAS_V2_INTERFACE

    if not HAS_V2_INTERFACE:
        return "the installed vLLM has no Model Runner V2 interface"
    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is False:
        return "VLLM_USE_V2_MODEL_RUNNER=0"
    if forced is None and not HAS_TRITON:
        return "Triton is unavailable on this platform, so vLLM uses the V1 runner"
    method = _spec_method(spec)
    if forced is None and method in _V1_ONLY_SPEC_METHODS:
        return f"speculative method {method!r} runs on the V1 runner only"
    return None


def check_engine_args(engine_args: Any) -> None:
    """Reject engine arguments (``EngineArgs`` or an ``LLM(**kwargs)`` mapping) that certainly fail."""
    runner, convert = _get(engine_args, "runner"), _get(engine_args, "convert")
    if runner == "pooling" or convert in _POOLING_CONVERTS:
        raise UnsupportedEngineConfig(_POOLING.format(why=f"runner={runner!r}, convert={convert!r}"))
    spec = _get(engine_args, "speculative_config")
    if spec:
        why = _v1_runner_is_certain(spec)
        if why is not None:
            raise UnsupportedEngineConfig(f"{_SPEC_ON_V1} ({why})")


def check_vllm_config(vllm_config: Any) -> None:
    """Reject a resolved ``VllmConfig`` the adapter cannot serve (vLLM has chosen the runner)."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is not None and getattr(model_config, "runner_type", None) == "pooling":
        raise UnsupportedEngineConfig(_POOLING.format(why="runner_type='pooling'"))
    if getattr(vllm_config, "speculative_config", None) is not None and not vllm_config.use_v2_model_runner:
        raise UnsupportedEngineConfig(f"{_SPEC_ON_V1} (this engine uses the V1 runner)")
