"""Hugging Face transformers adapter: ``dynamo_logits`` payloads inside ``model.generate()``.

The SDK's worked example: every rule (gating, realization, failure isolation, batched
application) is ``dynlogits.sdk``'s; this package only translates ``generate()``'s calling
convention onto it. Typical use::

    from dynlogits.adapters.transformers import generate_kwargs, payload_for

    payload = payload_for(spec, "agg", tokenizer)          # None on prefill/encode workers
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, **generate_kwargs(model, tokenizer, batch, [payload] * len(prompts)),
                         max_new_tokens=64)

Contracts, in short (details in each module):

* rows: ``generate()`` repeats prompt ``k`` ``max(num_beams, num_return_sequences)`` times,
  request-major; one fresh ``GuardedRequest`` per prompt owns all of its rows (beams, samples);
* history of a row: ``input_ids[row, prompt_width:]``, ``prompt_width`` being the padded input
  width; processors take positions from it (no step counters), so beams, samples and assisted
  generation's per-draft calls need nothing special;
* failures: a bad payload is rejected by ``generate_kwargs`` before ``generate()`` runs
  (``SpecError`` naming ``payloads[k]`` and the field); a processor that fails while generating
  fail-stops all rows of its own request to EOS, reported once; other requests are untouched;
* state: none beyond one ``generate()`` call; build new kwargs (fresh requests) for each call.

Modules: ``processor`` (the ``LogitsProcessor`` subclass and its builder), ``generate``
(activation, admission, ``generate()`` kwargs), ``conformance`` (the conformance kit's driver).
"""

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
