"""One engine configuration of the ``engine`` suite, run in its own process (``engine`` starts it).

``python -m dynlogits.bench.engine_worker '<json>'`` starts one offline ``vllm.LLM`` with the
given ``logits_processors``, warms it up, then runs every kind ``repeats`` times (kinds
interleaved) and prints ``RESULT_PREFIX`` followed by ``{kind: best tok/s}`` as its last line.
Each run is ``requests`` concurrent requests x ``tokens`` generated tokens (``ignore_eos``,
greedy). Before a run counts, its outputs are checked: every request generated exactly
``tokens`` tokens, forced requests exactly their forced tokens, banned requests no banned id;
otherwise it exits non-zero with the reason.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from . import workloads

__all__ = ["RESULT_PREFIX", "main"]

RESULT_PREFIX = "DYNLOGITS_BENCH_RESULT "
PROMPT_LEN = 16


def _check(kind: str, payloads: list[Any], outputs: list[Any], tokens: int, vocab: int) -> None:
    for i, out in enumerate(outputs):
        got = list(out.outputs[0].token_ids)
        if len(got) != tokens:
            raise SystemExit(f"{kind}: request {i} generated {len(got)} tokens, expected {tokens}")
        if kind == "forced_sequence":
            want = [workloads.next_token(payloads[i], n, vocab_size=vocab) for n in range(tokens)]
            if got != want:
                raise SystemExit(f"forced_sequence: request {i} generated {got[:8]}..., expected {want[:8]}...")
        elif kind == "banned_tokens" and set(got) & set(payloads[i][0]["token_ids"]):
            raise SystemExit(f"banned_tokens: request {i} generated a banned id")


def run(spec: dict[str, Any]) -> dict[str, float]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from dynlogits.specs import WIRE_KEY

    vocab, eos, n, tokens = spec["vocab"], spec["eos_token_id"], spec["requests"], spec["tokens"]
    llm = LLM(spec["model"], dtype="float32", enforce_eager=True, gpu_memory_utilization=0.2, seed=0,
              max_num_seqs=n, max_model_len=PROMPT_LEN + tokens + 16,
              logits_processors=list(spec["processors"]) or None)
    prompts = [TokensPrompt(prompt_token_ids=[(31 * i + j) % 900 + 5 for j in range(PROMPT_LEN)]) for i in range(n)]
    payloads: dict[str, list[Any]] = {}
    params: dict[str, list[Any]] = {}
    for kind in spec["kinds"]:
        payloads[kind] = [None if kind == "none" else workloads.payload(kind, vocab_size=vocab, eos_token_id=eos, seed=i)
                          for i in range(n)]
        params[kind] = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True,
                                       extra_args=None if p is None else {WIRE_KEY: p}) for p in payloads[kind]]
    best: dict[str, float] = {}
    for rep in range(spec["repeats"] + 1):  # the first round warms the engine up and is not counted
        for kind in spec["kinds"]:
            start = time.perf_counter()
            outputs = llm.generate(prompts, params[kind], use_tqdm=False)
            elapsed = time.perf_counter() - start
            _check(kind, payloads[kind], outputs, tokens, vocab)
            generated = sum(len(o.outputs[0].token_ids) for o in outputs)
            if rep:
                best[kind] = max(best.get(kind, 0.0), generated / elapsed)
            print(f"[engine-worker] {kind}: {'warm-up' if not rep else f'run {rep}'}: {generated / elapsed:.0f} tok/s",
                  file=sys.stderr, flush=True)
    llm.llm_engine.engine_core.shutdown()
    return best


def main(argv: list[str]) -> int:
    result = run(json.loads(argv[1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
