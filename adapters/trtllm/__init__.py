"""TensorRT-LLM adapter: dynamo logits payloads as TensorRT-LLM logits processors.

On the worker, per request::

    from dynlogits.adapters.trtllm import attach_logits_processors, check_llm_args
    check_llm_args(llm_kwargs)                       # once: refuses the PyTorch overlap scheduler
    attach_logits_processors(sampling_params, entries, prompt_token_ids, vocab_size=width)
    llm.generate_async(prompt_token_ids, sampling_params)

Built on ``dynlogits.sdk``; what is here is TensorRT-LLM's calling convention only. Modules:
``processor`` (the per-request callback; shapes, streams, failure policy, pickling), ``batched``
(the TensorRT backend's batched callback), ``attach`` (worker side), ``capabilities``,
``testing`` (harnesses modelled on TensorRT-LLM's call sites), ``conformance`` (the kit's drivers).
TensorRT-LLM itself is optional: the classes subclass its bases when ``tensorrt_llm`` imports.
"""

from .attach import attach_logits_processors, stop_token_ids
from .batched import DynamoTrtllmBatchedLogitsProcessor
from .capabilities import UnsupportedEngineConfig, check_llm_args
from .processor import FAILURES, HAS_TENSORRT_LLM, DynamoTrtllmLogitsProcessor

__all__ = [
    "FAILURES",
    "HAS_TENSORRT_LLM",
    "DynamoTrtllmBatchedLogitsProcessor",
    "DynamoTrtllmLogitsProcessor",
    "UnsupportedEngineConfig",
    "attach_logits_processors",
    "check_llm_args",
    "stop_token_ids",
]
