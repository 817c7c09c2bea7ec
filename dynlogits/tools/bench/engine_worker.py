"""One engine configuration of the ``engine`` suite, run in its own process (``engine`` starts it).

``python -m dynlogits.tools.bench.engine_worker '<json>'`` starts one offline ``vllm.LLM`` with the
given ``logits_processors``, runs a warm-up round, then ``rounds`` rounds of one batch per kind in
``round_order`` (so no kind always runs first or after the same kind). Prints one
``[engine-worker] round`` line per round on stderr and, last, ``RESULT_PREFIX`` +
``{"tok_per_s": {kind: [per round]}, "adapter_ms": {kind: [per round]}}``: ``adapter_ms``, the
time the engine spent in the adapter's calls during each batch, only with ``"call_times"`` (a file
path for ``timed.CallTimes``; the processor must be ``timed.TimedVllmLogitsProcessor``). Every
batch's outputs are checked (lengths, forced tokens, no banned id or phrase); otherwise it exits
non-zero with the reason."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from . import workloads

__all__ = ["PROGRESS_PREFIX", "RESULT_PREFIX", "main", "round_order"]

RESULT_PREFIX = "DYNLOGITS_BENCH_RESULT "
PROGRESS_PREFIX = "[engine-worker] "
PROMPT_LEN = 16


def round_order(kinds: list[str] | tuple[str, ...], rnd: int) -> list[str]:
    """The kinds in the order round ``rnd`` runs them: rotated by ``rnd``, and reversed in every
    other cycle of ``len(kinds)`` rounds so that each kind also follows each other one."""
    shift = rnd % len(kinds)
    order = [*kinds[shift:], *kinds[:shift]]
    return order[::-1] if (rnd // len(kinds)) % 2 else order


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
        elif kind == "banned_phrases" and workloads.writes_a_banned_phrase(payloads[i], got):
            raise SystemExit(f"banned_phrases: request {i} generated a banned phrase")


def run(spec: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    import os

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from dynlogits.specs import WIRE_KEY

    from .timed import CALL_TIMES_ENV, CallTimes

    times = None
    if spec.get("call_times"):  # before the engine starts: its process inherits the variable
        os.environ[CALL_TIMES_ENV] = spec["call_times"]
        times = CallTimes(spec["call_times"], create=True)
    vocab, eos, n, tokens = spec["vocab"], spec["eos_token_id"], spec["requests"], spec["tokens"]
    kinds, rounds = list(spec["kinds"]), int(spec["rounds"])
    llm = LLM(spec["model"], dtype="float32", enforce_eager=True, gpu_memory_utilization=0.2, seed=0,
              max_num_seqs=n, max_model_len=PROMPT_LEN + tokens + 16,
              logits_processors=list(spec["processors"]) or None)
    prompts = [TokensPrompt(prompt_token_ids=[(31 * i + j) % 900 + 5 for j in range(PROMPT_LEN)]) for i in range(n)]
    payloads: dict[str, list[Any]] = {}
    params: dict[str, list[Any]] = {}
    for kind in kinds:
        payloads[kind] = [None if kind == "none" else workloads.payload(kind, vocab_size=vocab, eos_token_id=eos, seed=i)
                          for i in range(n)]
        params[kind] = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True,
                                       extra_args=None if p is None else {WIRE_KEY: p}) for p in payloads[kind]]
    per_round: dict[str, list[float]] = {kind: [] for kind in kinds}
    adapter_ms: dict[str, list[float]] = {kind: [] for kind in kinds} if times is not None else {}
    for rnd in range(rounds + 1):  # round 0 warms the engine up and is not counted
        got: dict[str, float] = {}
        spent: dict[str, float] = {}
        for kind in round_order(kinds, rnd):
            before = times.read()[0] if times is not None else 0
            start = time.perf_counter()
            outputs = llm.generate(prompts, params[kind], use_tqdm=False)
            elapsed = time.perf_counter() - start
            if times is not None:  # the engine is idle once generate returns: the counters hold still
                spent[kind] = (times.read()[0] - before) / 1e6
            _check(kind, payloads[kind], outputs, tokens, vocab)
            got[kind] = sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed
        if rnd:
            for kind, tok_per_s in got.items():
                per_round[kind].append(tok_per_s)
            for kind, ms in spent.items():
                adapter_ms[kind].append(ms)
        label = "warm-up" if not rnd else f"round {rnd}/{rounds}"
        print(PROGRESS_PREFIX + f"{label}: " + ", ".join(f"{kind} {tps:.0f}" for kind, tps in got.items()) + " tok/s",
              file=sys.stderr, flush=True)
    llm.llm_engine.engine_core.shutdown()
    return {"tok_per_s": per_round, "adapter_ms": adapter_ms}


def main(argv: list[str]) -> int:
    result = run(json.loads(argv[1]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
