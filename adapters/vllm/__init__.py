"""vLLM adapter: run ``extra_args["dynamo_logits"]`` payloads in vLLM's sampler.

Install it with one of::

    register_dynamo_logits_processor(engine_args)            # EngineArgs / AsyncEngineArgs / LLM kwargs
    LLM(model, logits_processors=[DynamoVllmLogitsProcessor])
    vllm serve MODEL --logits-processors dynlogits.adapters.vllm:DynamoVllmLogitsProcessor

then put a payload on a request with ``activate(sampling_params, entries)``. Modules: ``processor``
(the class both runners load), ``v1`` / ``v2`` (each runner's bookkeeping and history source),
``request`` (payload reading, admission), ``capabilities`` (what cannot work), ``registration``,
``harness`` (a Model Runner V2 sampler harness for CPU-only machines). See docs/vllm.md."""

from dynlogits.sdk.activation import activate_logits_processors as activate

from .capabilities import UnsupportedEngineConfig, check_engine_args, check_vllm_config
from .processor import DynamoVllmLogitsProcessor
from .registration import PROCESSOR_FQCN, is_dynamo_processor, register_dynamo_logits_processor
from .request import read_payload, stop_token, validate
from .v2 import HAS_V2_INTERFACE

#: The engine-facing class (the same name in every adapter).
Processor = DynamoVllmLogitsProcessor

__all__ = [
    "HAS_V2_INTERFACE",
    "PROCESSOR_FQCN",
    "DynamoVllmLogitsProcessor",
    "Processor",
    "UnsupportedEngineConfig",
    "activate",
    "check_engine_args",
    "check_vllm_config",
    "is_dynamo_processor",
    "read_payload",
    "register_dynamo_logits_processor",
    "stop_token",
    "validate",
]
