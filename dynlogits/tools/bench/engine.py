"""The ``engine`` suite: a real vLLM CPU engine's throughput with and without processors.

One engine per configuration, each in its own process (``engine_worker``), one after the other:
``none`` (no processor); ``adapter`` (``DynamoVllmLogitsProcessor`` with its calls timed,
``timed.TimedVllmLogitsProcessor``, running kinds ``none``, ``banned_tokens``, ``banned_phrases``
and ``forced_sequence``, and beside it ``timed.TimedFloorProcessor``, the micro suite's floor
(``-inf`` over the rows) on a batch of its own, ``engine_worker.FLOOR_KIND``, timed the same way);
``reference`` (ai-dynamo-runtime 1.6.1, ``forced_sequence``). After a
warm-up, ``rounds`` rounds of one batch per kind (``requests`` x ``tokens``, vocab ``vocab``). A
record holds each round's tok/s and their median; in the ``adapter`` engine ``paired_ratio`` is the
median of each round's kind / idle (``none``) ratio, the figure the targets read with its
distribution-free confidence interval (``stats``), and
``attributed_ratio`` what the same rounds give when only the time spent in the adapter's calls
differs between the kind's batch and the idle one, ``attributed_share`` that time's share of the
kind's batch. The floor's batch becomes the record (impl ``floor``, kind ``forced_sequence``):
paired with the same engine's idle batches, its time the floor processor's own. Ratios across
engines are reported, never paired (method: ``docs``). With ``PROFILE_ENV`` naming a folder, the
adapter's engine also writes a cProfile of the adapter's calls per kind there (``<kind>.prof``,
warm-up round included; profiling slows the calls it times, so such a run's figures are not
the suite's); with ``timed.SECTIONS_ENV`` too (``module:qualname``, comma-separated), those functions
are timed instead, per kind, into ``sections.json`` (two clock reads a call)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .engine_worker import FLOOR_KIND, PROFILE_ENV, PROGRESS_PREFIX, RESULT_PREFIX
from .models import bench_model_dir, eos_token_id
from .records import EngineRecord
from .stats import median_interval

__all__ = ["ENGINE_CONFIGS", "FLOOR_FQCN", "PAIRED_BASE", "TIMED_FQCN", "split_floor", "EngineError", "EngineOptions", "records_for", "run_engine"]

#: ``timed.TimedVllmLogitsProcessor``'s import string (a string here: importing it imports vLLM)
TIMED_FQCN = "dynlogits.tools.bench.timed:TimedVllmLogitsProcessor"
#: ``timed.TimedFloorProcessor``'s: the micro floor's ``-inf`` fill on the rows of the floor's batch
FLOOR_FQCN = "dynlogits.tools.bench.timed:TimedFloorProcessor"
#: (impl, logits_processors, kinds run in that engine)
ENGINE_CONFIGS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("none", (), ("none",)),
    ("adapter", (TIMED_FQCN, FLOOR_FQCN), ("none", "banned_tokens", "banned_phrases", "forced_sequence", FLOOR_KIND)),
    ("reference", ("dynlogits.tools.bench.reference:ReferenceForcedSequenceProcessor",), ("forced_sequence",)),
)
#: the kind every other kind of the same engine is paired with, round by round
PAIRED_BASE = "none"


class EngineError(RuntimeError):
    """An engine configuration failed to start or produced wrong outputs."""


@dataclass(frozen=True)
class EngineOptions:
    requests: int = 64
    tokens: int = 64
    rounds: int = 25  # about 5 min per engine here; docs.py (method) says what the median of 25 is good to
    vocab: int = 151936
    timeout_s: float = 1800.0


def _run_config(impl: str, processors: tuple[str, ...], kinds: tuple[str, ...], opts: EngineOptions,
                say: Callable[[str], None], tmp: str) -> dict[str, dict[str, list[float]]]:
    model = bench_model_dir(opts.vocab)
    timed = TIMED_FQCN in processors
    spec = {"model": str(model), "vocab": opts.vocab, "eos_token_id": eos_token_id(model), "processors": processors,
            "kinds": kinds, "requests": opts.requests, "tokens": opts.tokens, "rounds": opts.rounds,
            "call_times": f"{tmp}/call_times" if timed else None,
            "floor_times": f"{tmp}/floor_times" if FLOOR_FQCN in processors else None,
            "profile": os.environ.get(PROFILE_ENV) if timed else None}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "dynlogits.tools.bench.engine_worker", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    timer = threading.Timer(opts.timeout_s, proc.kill)
    timer.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            if line.startswith(PROGRESS_PREFIX):  # one line per round, passed on as it comes
                say(f"[engine] {impl}: {line[len(PROGRESS_PREFIX):]}")
        returncode = proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode != 0
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    results = [line[len(RESULT_PREFIX):] for line in lines if line.startswith(RESULT_PREFIX)]
    if returncode != 0 or not results:
        tail = "\n".join(lines[-30:])
        why = f"timed out after {opts.timeout_s:.0f} s" if timed_out else f"exit {returncode}"
        raise EngineError(f"engine configuration {impl!r} failed ({why}); last output:\n{tail}")
    return {part: {str(k): [float(v) for v in values] for k, values in per_kind.items()}
            for part, per_kind in json.loads(results[-1]).items()}


def records_for(impl: str, per_round: dict[str, list[float]], adapter_ms: dict[str, list[float]] | None = None,
                tokens: int = 0) -> list[EngineRecord]:
    """One record per kind: its per-round tok/s, their median and, for every kind but the paired
    base of an engine that ran it, the median over rounds of (kind / base in the same round) and its
    95% interval. With
    ``adapter_ms`` (ms spent in the adapter's calls per round) and ``tokens`` per batch, also the
    median over rounds of ``t_base / (t_base + ms_kind - ms_base)``, ``t_base`` the base batch's
    wall time: the ratio if nothing but the adapter's own time differed; and for every timed kind the
    median over rounds of ``ms_kind / t_kind``, ``t_kind`` the kind's own batch's wall time: the
    adapter's share of an engine step."""
    base = per_round.get(PAIRED_BASE)
    spent = adapter_ms or {}
    records = []
    for kind, values in per_round.items():
        paired = attributed = interval = share = None
        if kind in spent and tokens > 0:
            share = statistics.median(ms / (1000.0 * tokens / v) for ms, v in zip(spent[kind], values, strict=True))
        if base is not None and kind != PAIRED_BASE:
            ratios = [v / b for v, b in zip(values, base, strict=True)]
            paired, interval = statistics.median(ratios), median_interval(ratios)
            if kind in spent and PAIRED_BASE in spent and tokens > 0:
                walls = [1000.0 * tokens / b for b in base]  # ms per base batch
                attributed = statistics.median(w / (w + k - i) for w, k, i in
                                               zip(walls, spent[kind], spent[PAIRED_BASE], strict=True))
        records.append(EngineRecord(kind=kind, impl=impl, tok_per_s=statistics.median(values), rounds=len(values),
                                    paired_ratio=paired, paired_interval=interval, round_tok_per_s=tuple(values),
                                    attributed_ratio=attributed, round_adapter_ms=tuple(spent.get(kind, ())),
                                    attributed_share=share))
    return records


def split_floor(impl: str, got: dict[str, dict[str, list[float]]], tokens: int) -> list[EngineRecord]:
    """The records of one engine's result (``engine_worker``'s parts): its kinds' with the adapter's
    time, and, where it ran the floor's batch, one record (impl ``floor``, kind
    ``forced_sequence``) paired with the same engine's idle batches whose time is the floor
    processor's own (``floor_ms``), never the adapter's."""
    per_round = dict(got["tok_per_s"])
    adapter_ms = {k: v for k, v in got.get("adapter_ms", {}).items() if k != FLOOR_KIND}
    floor_round = per_round.pop(FLOOR_KIND, None)
    records = records_for(impl, per_round, adapter_ms, tokens)
    if floor_round is not None:
        floor_ms = got.get("floor_ms", {})
        spent = ({PAIRED_BASE: floor_ms[PAIRED_BASE], "forced_sequence": floor_ms[FLOOR_KIND]}
                 if PAIRED_BASE in floor_ms and FLOOR_KIND in floor_ms else None)
        paired = {"forced_sequence": floor_round}
        if PAIRED_BASE in per_round:
            paired = {PAIRED_BASE: per_round[PAIRED_BASE], **paired}
        records += [r for r in records_for("floor", paired, spent, tokens) if r.kind != PAIRED_BASE]
    return records


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
        say(f"[engine] {impl}: starting a vLLM engine (about a minute), then a warm-up round and {opts.rounds} "
            f"round(s) of one batch of {opts.requests} requests x {opts.tokens} tokens per kind ({', '.join(kinds)}), "
            "kinds in an order that changes every round")
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="dynlogits-bench-") as tmp:
            got = _run_config(impl, processors, kinds, opts, say, tmp)
        records += split_floor(impl, got, opts.requests * opts.tokens)
        say(f"[engine] {impl}: done in {time.perf_counter() - start:.0f} s")
    return records, skipped
