"""vLLM adapter: run ``extra_args["dynamo_logits"]`` payloads in vLLM's sampler.

Use one of::

    register_dynamo_logits_processor(engine_args)            # EngineArgs / AsyncEngineArgs / LLM kwargs
    LLM(model, logits_processors=[DynamoVllmLogitsProcessor])
    vllm serve MODEL --logits-processors dynlogits.adapters.vllm:DynamoVllmLogitsProcessor

then put a payload on a request with ``dynlogits.activation.activate_logits_processors``.

Built on ``dynlogits.sdk`` (realization, failure isolation, batched application); what is here is
only vLLM's calling convention. Modules: ``processor`` (the class, and why one class serves both
runners), ``v1`` / ``v2`` (each runner's bookkeeping and where a row's history comes from),
``request`` (reading the payload from ``SamplingParams``, admission), ``capabilities`` (what cannot
work), ``registration``, ``testing`` (a Model Runner V2 sampler harness for CPU-only machines).
"""

from .capabilities import UnsupportedEngineConfig, check_engine_args, check_vllm_config
from .processor import DynamoVllmLogitsProcessor
from .registration import PROCESSOR_FQCN, is_dynamo_processor, register_dynamo_logits_processor
from .request import GuardedRequest, read_payload, validate_request_params
from .v2 import HAS_V2_INTERFACE

__all__ = [
    "HAS_V2_INTERFACE",
    "PROCESSOR_FQCN",
    "DynamoVllmLogitsProcessor",
    "GuardedRequest",
    "UnsupportedEngineConfig",
    "check_engine_args",
    "check_vllm_config",
    "is_dynamo_processor",
    "read_payload",
    "register_dynamo_logits_processor",
    "validate_request_params",
]
