"""TensorRT-LLM adapter: dynamo logits payloads as TensorRT-LLM logits processors.

On the worker, per request::

    from dynlogits.adapters.trtllm import activate, check_llm_args
    check_llm_args(llm_kwargs)                       # once: refuses what cannot work (overlap scheduler, ...)
    activate(sampling_params, entries, vocab_size=width)
    llm.generate_async(prompt_token_ids, sampling_params)

Modules: ``processor`` (the per-request callback), ``batched`` (the TensorRT backend's batched
callback, executor API only), ``activation`` (worker side), ``capabilities`` (what is refused),
``harness`` (call sites modelled on TensorRT-LLM 1.3.0rc29, sources cited), ``conformance`` (drivers).
TensorRT-LLM is optional: the classes subclass its bases when ``tensorrt_llm`` imports."""

from .activation import BOTH_CALLBACKS, activate, stop_token, validate
from .batched import NOT_THROUGH_LLM_API, DynamoTrtllmBatchedLogitsProcessor
from .capabilities import UnsupportedEngineConfig, check_llm_args
from .processor import FAILURES, HAS_TENSORRT_LLM, DynamoTrtllmLogitsProcessor, register_ipc_classes

#: The engine-facing class (the same name in every adapter).
Processor = DynamoTrtllmLogitsProcessor

__all__ = [
    "BOTH_CALLBACKS",
    "FAILURES",
    "HAS_TENSORRT_LLM",
    "NOT_THROUGH_LLM_API",
    "DynamoTrtllmBatchedLogitsProcessor",
    "DynamoTrtllmLogitsProcessor",
    "Processor",
    "UnsupportedEngineConfig",
    "activate",
    "check_llm_args",
    "register_ipc_classes",
    "stop_token",
    "validate",
]
