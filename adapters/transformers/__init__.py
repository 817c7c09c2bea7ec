"""Hugging Face transformers adapter: ``dynamo_logits`` payloads inside ``model.generate()``.

The SDK's worked example (docs/sdk.md): every rule is ``dynlogits.sdk``'s; this package translates
``generate()``'s calling convention onto it::

    from dynlogits.adapters.transformers import generate_kwargs, payload_for

    payload = payload_for(spec, "agg", tokenizer)          # None on prefill/encode workers
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, **generate_kwargs(model, tokenizer, batch, [payload] * len(prompts)),
                         max_new_tokens=64)

A bad payload is refused by ``generate_kwargs`` before ``generate()`` runs; a request failing while
generating is fail-stopped to EOS on all its rows, reported once. No state outlives one
``generate()`` call. Modules: ``processor`` (the ``LogitsProcessor`` and its builder), ``generate``
(activation, admission, kwargs), ``conformance`` (the kit's driver)."""

from .generate import activate, generate_kwargs, logits_width, payload_for, stop_token, validate
from .processor import DynamoLogitsProcessor, logits_processor, realize_request

#: The engine-facing class (the same name in every adapter).
Processor = DynamoLogitsProcessor

__all__ = [
    "DynamoLogitsProcessor",
    "Processor",
    "activate",
    "generate_kwargs",
    "logits_processor",
    "logits_width",
    "payload_for",
    "realize_request",
    "stop_token",
    "validate",
]
