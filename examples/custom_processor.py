"""A custom processor plugged in through operator config (the ``python`` kind), on offline vLLM.

    python examples/custom_processor.py                      # prints: tick tock tick tock
    python examples/custom_processor.py --config my.yaml --model /path/to/model

``TokenCycle`` below is the processor: any callable ``(generated_ids, logits_row) -> None``
that edits the row in place works. ``custom_processor.yaml`` names it by import string; the
worker realizes it only because this script allow-lists exactly the factories its config names
(``DYN_LOGITS_PYTHON_FACTORIES``) — a client request can never carry this kind.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class TokenCycle:
    """Force ``token_ids`` over and over, ``repeat`` times, then EOS.

    Position comes from ``len(generated_ids)``, so the processor is stateless.
    """

    def __init__(self, token_ids: Sequence[int], repeat: int, eos_token_id: int) -> None:
        self.sequence = list(token_ids) * repeat + [eos_token_id]

    def __call__(self, generated_ids: Sequence[int], logits: torch.Tensor) -> None:
        target = self.sequence[min(len(generated_ids), len(self.sequence) - 1)]
        logits.fill_(float("-inf"))
        logits[target] = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "custom_processor.yaml"))
    parser.add_argument("--model", default=None, help="Hugging Face model folder (default: the embedded model)")
    args = parser.parse_args()

    from dynlogits.policy.config import load_config

    config = load_config(args.config)
    factories = [e.factory for e in (config.spec.entries if config.spec else ()) if e.kind == "python"]
    # The operator's two decisions: what may be imported, and from where. Both reach the
    # engine's own processes through the environment.
    os.environ["DYN_LOGITS_PYTHON_FACTORIES"] = ",".join(factories)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams

    from dynlogits.sdk import activate_logits_processors
    from dynlogits.adapters.vllm import register_dynamo_logits_processor
    from dynlogits.model_builder import default_model_dir
    from dynlogits.policy.roles import DisaggregationMode, logits_processors_for_request
    from dynlogits.policy.text import resolve_entries

    model = args.model or str(default_model_dir())
    llm = LLM(model, **register_dynamo_logits_processor(
        {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.2, "max_model_len": 512}
    ))
    entries = logits_processors_for_request(config.spec, disaggregation_mode=DisaggregationMode.AGGREGATED)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    activate_logits_processors(params, resolve_entries(entries, llm.get_tokenizer()))
    (output,) = llm.generate(["Tell the time."], params, use_tqdm=False)
    print(output.outputs[0].text.strip())


if __name__ == "__main__":
    main()
