"""No fused kernel compiles inside an engine step, on a real GPU.

``python -m dynlogits.testing.cuda.compile_check [--vocab V] [--json FILE]`` (a GPU with Triton; no
engine) records every Triton compile with its kernel and thread (``JITFunction._do_compile``: what a
launch's or a ``warmup``'s in-memory cache miss runs, ``triton/runtime/jit.py``), then:

1. makes a ``SlotBatch`` of ``vocab`` ids (its ``warm(device, vocab)`` probes every gate and
   compiles the width's variants: compiles there are the engine load's);
2. sweeps V1-runner-shaped steps (``EngineStep(histories=...)``) over ``WORKLOADS`` (the variants a
   client picks: phrase and choice lengths, n-gram sizes, DRY look-backs, watermark context widths;
   a forced sequence, a restrictive entry), ``BATCHES`` and float32 / bfloat16 logits, ``STEPS``
   steps each;
3. waits for the compile thread (``kernels.variants.COMPILER``) and sweeps again.

Passes when no compile ran on the sweeping thread in either sweep (a compile in a step stalls the
whole batch) and the second sweep compiled nothing on any thread (the first sweep's compiles
landed). Prints the compiles the background thread ran during the first sweep: variants whose
steps ran the eager path until they landed. Exit status: 0 pass, 1 fail, 2 no CUDA or a Triton
without ``JITFunction._do_compile``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["BATCHES", "STEPS", "WORKLOADS", "Compile", "SweepResult", "main", "recorded", "sweep"]

#: batch sizes of the sweep: 1, a multiple of 16, one past it (Triton's int classes) and an engine's 64
BATCHES = (1, 2, 16, 17, 64)
#: steps per (workload, batch, dtype): the first may queue a compile, the others run while it does
STEPS = 3
EOS = 1

Payload = Callable[[int, int], list[dict[str, Any]]]


def _ids(vocab: int, i: int, n: int, salt: int) -> list[int]:
    return [(salt * 7919 + i * 131 + j * 17) % (vocab - 3) + 2 for j in range(n)]


def _phrases(length: int) -> Payload:
    return lambda v, i: [{"kind": "banned_phrases", "phrases": [_ids(v, i, length, k) for k in range(4)]}]


def _choices(length: int) -> Payload:
    return lambda v, i: [{"kind": "multiple_choice", "choices": [_ids(v, i, length, k) for k in range(3)],
                          "eos_token_id": EOS}]


def _one(entry: dict[str, Any]) -> Payload:
    return lambda v, i: [dict(entry)]


#: What a client's payload may pick, per workload (each one kind, or a restrictive pair).
WORKLOADS: dict[str, Payload] = {
    "banned_phrases 2": _phrases(2),
    "banned_phrases 9": _phrases(9),
    "banned_phrases 33": _phrases(33),
    "multiple_choice 3": _choices(3),
    "multiple_choice 12": _choices(12),
    "multiple_choice 40": _choices(40),
    **{f"no_repeat_ngram {n}": _one({"kind": "no_repeat_ngram", "size": n}) for n in (2, 3, 5)},
    **{f"dry {n}": _one({"kind": "dry", "multiplier": 0.8, "penalty_last_n": n, "sequence_breakers": []})
       for n in (-1, 16, 200)},
    **{f"watermark {w}": _one({"kind": "watermark", "key": 2**64 - 1, "context_width": w}) for w in (1, 4, 9)},
    "forced_sequence": lambda v, i: [{"kind": "forced_sequence", "token_ids": _ids(v, i, 8, 0), "eos_token_id": EOS}],
    "allowed_tokens": lambda v, i: [{"kind": "allowed_tokens", "token_ids": _ids(v, i, 6, 1), "eos_token_id": EOS}],
    "thinking_budget": lambda v, i: [{"kind": "thinking_budget", "start_token_ids": [_ids(v, i, 1, 2)[0]],
                                      "end_token_ids": _ids(v, i, 2, 3), "budget": 2}],
}


@dataclass(frozen=True)
class Compile:
    kernel: str
    thread: str


@contextmanager
def recorded() -> Iterator[list[Compile]]:
    """Every Triton compile (``JITFunction._do_compile``) while the block runs, in order, with the
    thread that ran it. ``RuntimeError`` where this Triton has no ``_do_compile``."""
    from triton.runtime.jit import JITFunction

    real = getattr(JITFunction, "_do_compile", None)
    if real is None:
        raise RuntimeError("this Triton's JITFunction has no _do_compile: compiles cannot be recorded")
    seen: list[Compile] = []

    def do_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(Compile(getattr(self, "__name__", type(self).__name__), threading.current_thread().name))
        return real(self, *args, **kwargs)

    JITFunction._do_compile = do_compile  # the recording wrapper, put back below
    try:
        yield seen
    finally:
        JITFunction._do_compile = real


@dataclass
class SweepResult:
    #: ``workload / batch / dtype: kernel`` of each compile the sweeping thread ran (must be none)
    in_step: list[str] = field(default_factory=list)
    #: the same for the background compile thread (variants compiled off the step)
    off_step: list[str] = field(default_factory=list)
    steps: int = 0


def sweep(batch: Any, device: torch.device, vocab: int, seen: list[Compile], *,
          workloads: dict[str, Payload] = WORKLOADS, batches: Sequence[int] = BATCHES, steps: int = STEPS,
          dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16)) -> SweepResult:
    """Steps of ``batch`` (a ``SlotBatch``) as the V1 runner makes them, each workload's requests in
    rows ``0..b-1``; the compiles ``seen`` meanwhile, by thread (see the module doc)."""
    from dynlogits import sdk
    from dynlogits.sdk.resident.engine_step import EngineStep
    from dynlogits.testing.cuda import watermark_check

    me = threading.current_thread().name
    result = SweepResult()
    facts = sdk.RequestFacts(sampling=watermark_check.SAMPLING)  # sampling: the watermark draws
    stop = sdk.pick_stop_token(EOS, None, vocab)
    for name, make in workloads.items():
        for b in batches:
            requests = [sdk.realize(make(vocab, i), vocab_size=vocab, stop_token_id=stop, facts=facts) for i in range(b)]
            for slot, request in enumerate(requests):
                if request is None or not request.resident:
                    raise RuntimeError(f"{name}: request {slot} is not resident")
                batch.assign(slot, request)
            batch.set_rows(np.arange(b, dtype=np.int64))
            batch.flush()
            for dtype in dtypes:
                histories = [_ids(vocab, i, 12, 5) * 2 for i in range(b)]  # repeats: the bans and penalties fire
                for step in range(steps):
                    logits = torch.randn(b, vocab, device=device).to(dtype)
                    before = len(seen)
                    batch.apply(logits, EngineStep(histories=histories))
                    for compiled in seen[before:]:
                        where = result.in_step if compiled.thread == me else result.off_step
                        where.append(f"{name} / batch {b} / {str(dtype).removeprefix('torch.')}: {compiled.kernel}")
                    result.steps += 1
                    for i, history in enumerate(histories):
                        history.append(_ids(vocab, i, 12, 5)[(len(history) + step) % 12])
            for slot in range(b):
                batch.assign(slot, None)
            batch.flush()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.compile_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("[compile_check] no CUDA device", file=sys.stderr)
        return 2
    from dynlogits import sdk
    from dynlogits.kernels.variants import COMPILER

    logging.getLogger("dynlogits.sdk").setLevel(logging.ERROR)  # the workloads' rows left empty (multiple_choice
    # past its choices) are each reported: expected here; a kernel's warning (dynlogits.kernels) still shows
    device = torch.device("cuda")
    try:
        with recorded() as seen:
            slots = sdk.SlotBatch(num_slots=max(BATCHES) + 1, vocab_size=args.vocab, device=device, host_histories=True)
            at_load = len(seen)
            print(f"[compile_check] SlotBatch made: {at_load} compiles at load", flush=True)
            first = sweep(slots, device, args.vocab, seen)
            landed = COMPILER.join(timeout=600)
            before = len(seen)
            second = sweep(slots, device, args.vocab, seen)
            late = [f"{c.thread}: {c.kernel}" for c in seen[before:]]
    except RuntimeError as exc:
        print(f"[compile_check] {exc}", file=sys.stderr)
        return 2
    passed = not first.in_step and not second.in_step and not late and landed
    print(f"[compile_check] first sweep: {first.steps} steps, {len(first.in_step)} compiles in a step, "
          f"{len(first.off_step)} off the step")
    for line in first.in_step:
        print(f"  IN STEP: {line}")
    for line in first.off_step:
        print(f"  off step: {line}")
    print(f"[compile_check] compile thread idle before the second sweep: {landed}")
    print(f"[compile_check] second sweep: {second.steps} steps, {len(late)} compiles on any thread")
    for line in late:
        print(f"  AFTER LANDING: {line}")
    print(f"[compile_check] {'PASS' if passed else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"passed": passed, "at_load": at_load, "first": asdict(first), "landed": landed,
                       "second": asdict(second), "late": late}, out, indent=1)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
