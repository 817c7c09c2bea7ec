"""The ``engine`` suite: a real vLLM CPU engine's throughput with and without processors.

Configurations, each in its own process (``engine_worker``) so that one engine's memory and
threads never weigh on another's run, one engine per processor list:

* ``none``: no custom logits processor;
* ``adapter``: ``logits_processors=[DynamoVllmLogitsProcessor]``, runs requests without a payload
  (kind ``none``: the adapter installed but idle), ``banned_tokens`` (100 ids) and
  ``forced_sequence`` (64 tokens) on every request, interleaved in the same engine, so their
  ratios to each other are measured side by side;
* ``reference``: ``logits_processors=[ReferenceForcedSequenceProcessor]`` (ai-dynamo-runtime
  1.6.1), ``forced_sequence`` on every request.

Each engine serves ``requests`` concurrent requests x ``tokens`` tokens, best of ``repeats`` runs
after one warm-up run, on the embedded model built with vocab ``vocab`` (151936 by default).
Engines start one after the other, never at the same time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .engine_worker import RESULT_PREFIX
from .models import bench_model_dir, eos_token_id
from .records import EngineRecord

__all__ = ["ENGINE_CONFIGS", "EngineError", "EngineOptions", "run_engine"]

#: (impl, logits_processors, kinds run in that engine)
ENGINE_CONFIGS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("none", (), ("none",)),
    ("adapter", ("dynlogits.adapters.vllm:DynamoVllmLogitsProcessor",), ("none", "banned_tokens", "forced_sequence")),
    ("reference", ("dynlogits.bench.reference:ReferenceForcedSequenceProcessor",), ("forced_sequence",)),
)


class EngineError(RuntimeError):
    """An engine configuration failed to start or produced wrong outputs."""


@dataclass(frozen=True)
class EngineOptions:
    requests: int = 64
    tokens: int = 64
    repeats: int = 3
    vocab: int = 151936
    timeout_s: float = 1800.0


def _run_config(impl: str, processors: tuple[str, ...], kinds: tuple[str, ...], opts: EngineOptions) -> dict[str, float]:
    model = bench_model_dir(opts.vocab)
    spec = {"model": str(model), "vocab": opts.vocab, "eos_token_id": eos_token_id(model), "processors": processors,
            "kinds": kinds, "requests": opts.requests, "tokens": opts.tokens, "repeats": opts.repeats}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "dynlogits.bench.engine_worker", json.dumps(spec)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=opts.timeout_s)
    results = [line[len(RESULT_PREFIX):] for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not results:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise EngineError(f"engine configuration {impl!r} failed (exit {proc.returncode}); last output:\n{tail}")
    return {str(k): float(v) for k, v in json.loads(results[-1]).items()}


def run_engine(opts: EngineOptions, *, progress: Callable[[str], None] | None = None) -> tuple[list[EngineRecord], list[str]]:
    """Run every configuration one after the other; returns the records and notes on what was skipped."""
    from .reference import reference_available

    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    records: list[EngineRecord] = []
    skipped: list[str] = []
    for impl, processors, kinds in ENGINE_CONFIGS:
        if impl == "reference" and (why := reference_available()) is not None:
            skipped.append(f"engine reference: {why}")
            continue
        say(f"[engine] {impl}: starting a vLLM engine (about a minute), then {opts.repeats} run(s) of "
            f"{opts.requests} requests x {opts.tokens} tokens per kind after a warm-up")
        start = time.perf_counter()
        for kind, tok_per_s in _run_config(impl, processors, kinds, opts).items():
            records.append(EngineRecord(kind=kind, impl=impl, tok_per_s=tok_per_s))
        say(f"[engine] {impl}: done in {time.perf_counter() - start:.0f} s")
    return records, skipped
