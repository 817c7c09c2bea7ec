"""TensorRT-LLM adapter: dynamo logits payloads as TensorRT-LLM logits processors.

On the worker, per request::

    from dynlogits.adapters.trtllm import activate, check_llm_args
    check_llm_args(llm_kwargs)                       # once: refuses the PyTorch overlap scheduler
    activate(sampling_params, entries, prompt_token_ids, vocab_size=width)
    llm.generate_async(prompt_token_ids, sampling_params)

Built on ``dynlogits.sdk``; what is here is TensorRT-LLM's calling convention only. Modules:
``processor`` (the per-request callback; shapes, streams, failure policy, pickling), ``batched``
(the TensorRT backend's batched callback), ``activation`` (worker side), ``capabilities``,
``harness`` (harnesses modelled on TensorRT-LLM's call sites), ``conformance`` (the kit's drivers).
TensorRT-LLM itself is optional: the classes subclass its bases when ``tensorrt_llm`` imports.
"""

from .activation import activate, stop_token_ids, validate
from .batched import DynamoTrtllmBatchedLogitsProcessor
from .capabilities import UnsupportedEngineConfig, check_llm_args
from .processor import FAILURES, HAS_TENSORRT_LLM, DynamoTrtllmLogitsProcessor

#: The engine-facing class (the same name in every adapter).
Processor = DynamoTrtllmLogitsProcessor

__all__ = [
    "FAILURES",
    "HAS_TENSORRT_LLM",
    "DynamoTrtllmBatchedLogitsProcessor",
    "DynamoTrtllmLogitsProcessor",
    "Processor",
    "UnsupportedEngineConfig",
    "activate",
    "check_llm_args",
    "stop_token_ids",
    "validate",
]
