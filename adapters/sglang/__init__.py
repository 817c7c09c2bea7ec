"""SGLang adapter: ``custom_params["dynamo_logits"]`` payloads in SGLang's sampler.

On the worker, before a request enters SGLang::

    from dynlogits.adapters.sglang import activate
    fields = activate(sampling_params, entries)     # sets custom_params; returns the processor string too
    engine.generate(input_ids=ids, sampling_params=sampling_params,
                    custom_logit_processor=fields.custom_logit_processor)

The engine needs ``enable_custom_logit_processor=True`` (``engine.enable_adapter``) and
``SGLANG_ENABLE_DELAY_SAMPLE=1`` (``engine.sglang_engine_env``). Proven on SGLang 0.5.21 and 0.5.23.
Modules: ``processor`` (the ``CustomLogitProcessor``), ``locate`` (positions and histories),
``custom_params`` (the payload's encodings, admission), ``activation`` (worker side), ``engine``
(settings), ``harness`` and ``conformance`` (test drivers), ``compat`` (CPU-test import shim).
This package imports without SGLang; ``processor`` needs ``sglang``."""

from typing import Any

from .activation import SglangActivation, activate
from .custom_params import carried_payload, encode_carried, validate
from .engine import UnsupportedEngineConfig, check_server_args, enable_adapter, sglang_engine_env
from .locate import stop_token

__all__ = [
    "Processor",
    "SglangActivation",
    "UnsupportedEngineConfig",
    "activate",
    "carried_payload",
    "check_server_args",
    "enable_adapter",
    "encode_carried",
    "sglang_engine_env",
    "stop_token",
    "validate",
]


def __getattr__(name: str) -> Any:
    """``Processor``, the engine-facing class (the same name in every adapter):
    ``processor.DynamoSglangLogitProcessor``, imported on first use since it needs ``sglang``."""
    if name == "Processor":
        from .processor import DynamoSglangLogitProcessor

        return DynamoSglangLogitProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
