"""SGLang adapter: ``custom_params["dynamo_logits"]`` payloads in SGLang's sampler.

On the worker, before a request enters SGLang::

    from dynlogits.adapters.sglang import activate
    fields = activate(sampling_params, entries)     # sets custom_params; returns the processor string too
    engine.generate(input_ids=ids, sampling_params=sampling_params,
                    custom_logit_processor=fields.custom_logit_processor)

with the engine started with ``enable_custom_logit_processor=True`` (``engine.enable_adapter``) and
``SGLANG_ENABLE_DELAY_SAMPLE=1`` (``engine.sglang_engine_env``).

Proven on SGLang 0.5.21 (NVIDIA Dynamo 1.6.1's pin) and 0.5.23, with their real classes.

Built on ``dynlogits.sdk``; what is here is SGLang's calling convention only. Modules:
``processor`` (``DynamoSglangLogitProcessor``, a real ``CustomLogitProcessor``; how SGLang calls
it), ``locate`` (position and history under the overlap scheduler), ``custom_params`` (the
payload's two encodings, our JSON text and NVIDIA Dynamo's list of entries, and admission),
``activation`` (worker side), ``engine`` (engine settings), ``harness`` (a scheduler harness over
SGLang's real classes), ``conformance`` (the kit's drivers), ``compat`` (the CPU-test import shim;
never needed where SGLang is installed with its dependencies).

This package imports without SGLang; ``processor`` needs ``sglang`` importable.
"""

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
