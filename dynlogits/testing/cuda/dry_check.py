"""``dry``'s fused Model Runner V2 step (``processors.dry_device.fused_lower_``) on a real CUDA device.

``python -m dynlogits.testing.cuda.dry_check`` runs ``run`` on the GPU (exit status 1 on any
difference or failure, 2 without CUDA); ``--cpu`` is its CPU self test (``lower_window_`` against the
dense reference, and the same bit comparisons in Triton's interpreter, ``TRITON_INTERPRET=1``, in a
subprocess; no device figures). Figures, one line each:

* ``probe``: the kind's gate (``fused_ready``) on the device: its probe passed;
* ``bits``: per batch (1, 64, 256), logits dtype (float32, bfloat16) and drafts (0, 2), over random
  windows of ``W`` 2048 and cap 160 (repeating cycles, breakers in some slots, placeholders, prompts
  counted or not, vocabulary 151936), without floors and with per-row floors (a scoped entry's
  stretch, ``dry_device.probe_floor``): the rows lowered by the Triton kernel and ``scatter_reduce_``
  against ``dense_lower_`` on the same device and against ``lower_window_`` on the CPU (rows
  differing, each must be 0);
* ``kernels``: device ops (kernels, copies, memsets) of one steady fused step after warm-up, from
  ``torch.profiler`` (declared: 2), beside the dense reference's;
* ``sync``: one fused step under ``torch.cuda.set_sync_debug_mode("error")``, after warm-up;
* ``time``: per step, fused and dense (CUDA events)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from dynlogits.processors import dry_device
from dynlogits.processors.dry_device import NO_BREAKER, StepArgs, dense_lower_, lower_window_, probe_floor

from .timing import device_ops, sync_error, timed

__all__ = ["BATCHES", "main", "make_case", "run"]

#: batches of the bit comparisons and timings
BATCHES = (1, 64, 256)


def make_case(requests: int, drafts: int, *, vocab: int = 151936, width: int = 2048, cap: int = 160,
              seed: int = 0) -> tuple[StepArgs, int, int]:
    """A Model Runner V2 step on the host: ``requests`` slots (histories up to ``width + 200`` tokens:
    a prompt, then a cycle of a few ids repeated with noise, a placeholder here and there), each with
    ``1 + drafts`` rows (row ``k`` fed ``k`` drafts), tables as ``DryGroup`` writes them (a third of
    the slots with breakers, look-backs and allowed lengths mixed), float32 logits with ``-inf``,
    ``+inf`` and NaN; then ``width`` and ``cap``."""
    g = torch.Generator().manual_seed(seed)
    max_len = width + 200
    slots = requests + 1
    tokens = torch.randint(0, vocab, (slots, max_len), generator=g, dtype=torch.int32)
    lengths = torch.randint(2, max_len - drafts, (requests,), generator=g)
    for s in range(requests):
        cycle = torch.randint(0, vocab, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g, dtype=torch.int32)
        start = int(torch.randint(0, int(lengths[s]), (1,), generator=g))
        run = tokens[s, start: int(lengths[s])]
        run[:] = cycle.repeat(len(run) // len(cycle) + 1)[: len(run)]
        noise = torch.rand(len(run), generator=g) < 0.02
        run[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g, dtype=torch.int32)
    tokens[torch.rand(slots, max_len, generator=g) < 0.001] = -1
    prompt_len = torch.minimum(torch.randint(0, 600, (slots,), generator=g), lengths.max()).to(torch.int32)
    rows = requests * (1 + drafts)
    slot_of_row = torch.arange(requests).repeat_interleave(1 + drafts)
    local_pos = torch.arange(1 + drafts).repeat(requests).to(torch.int32)
    pos = (lengths[slot_of_row] - 1 + local_pos).to(torch.int32)
    input_ids = tokens[slot_of_row, (pos - local_pos).long()].clone()
    input_ids[local_pos > 0] = torch.randint(0, vocab, (int((local_pos > 0).sum()),), generator=g, dtype=torch.int32)
    member = torch.rand(rows, generator=g) < 0.9
    allowed = torch.randint(1, 4, (slots,), generator=g)
    lookback = torch.tensor([width, 512, 64, 2048])[torch.randint(0, 4, (slots,), generator=g)]
    caps = torch.minimum(allowed + 158, lookback)
    params = torch.stack((allowed, lookback, torch.randint(0, 2, (slots,), generator=g), caps), 1)
    singles = torch.full((slots, 8), NO_BREAKER, dtype=torch.long)
    for s in range(0, slots, 3):
        singles[s] = torch.sort(torch.randint(0, vocab, (8,), generator=g))[0]
    amounts = torch.tensor([[0.8 * 1.75 ** e for e in range(160)]] * slots, dtype=torch.float64)
    logits = torch.randn(rows, vocab, generator=g) * 4
    logits[0, :100] = float("-inf")
    if rows > 2:
        logits[1, :100], logits[2, :100] = float("inf"), float("nan")
    step: StepArgs = (logits, tokens, prompt_len, pos, input_ids if drafts else None, local_pos if drafts else None,
                      slot_of_row, member, params, singles, amounts)
    return step, width, int(caps.max())


def _on(step: StepArgs, device: torch.device) -> StepArgs:
    return cast(StepArgs, tuple(t.to(device) if t is not None else None for t in step))


def _rows_differing(a: torch.Tensor, b: torch.Tensor) -> int:
    same = (a.isnan() == b.isnan()) & ((a == b) | a.isnan())
    return int((~same.all(1)).sum())


def bits(device: torch.device, batches: Sequence[int] = BATCHES, vocab: int = 151936, width: int = 2048,
         fused_step: Callable[..., None] | None = None) -> list[dict[str, Any]]:
    """Per batch, dtype, drafts and floors (none, or ``probe_floor``'s): the fused step's rows
    (``fused_step``, by default the op as it dispatches on ``device``) differing from
    ``dense_lower_`` on ``device`` and from ``lower_window_`` on the CPU, and the rows it lowered
    (the premise)."""
    step_fn = fused_step or dry_device.fused_lower_
    out = []
    for batch in batches:
        for drafts, floored in ((0, False), (2, False), (2, True)):
            step, w, cap = make_case(max(1, batch // (1 + drafts)), drafts, vocab=vocab, width=width, seed=batch + drafts)
            on = _on(step, device)
            floor = probe_floor(batch, step) if floored else None
            floor_on = None if floor is None else floor.to(device)
            for dtype in (torch.float32, torch.bfloat16):
                start = on[0].to(dtype, copy=True)
                fused, dense = start.clone(), start.clone()
                step_fn(fused, *on[1:], w, cap, floor_on)
                dense_lower_(dense, *on[1:], w, cap, floor_on)
                cpu = step[0].to(dtype, copy=True)
                lower_window_(cpu, *step[1:], w, cap, floor)
                out.append({"batch": batch, "drafts": drafts, "floors": floored, "dtype": str(dtype).split(".")[-1],
                            "vs_dense": _rows_differing(fused, dense), "vs_cpu": _rows_differing(fused.cpu(), cpu),
                            "rows_lowered": _rows_differing(fused, start)})
    return out


def _line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def run(device: torch.device, *, steps: int = 100, batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure on a CUDA ``device`` (see the module doc); whether all passed, and the figures."""
    results: dict[str, Any] = {}
    dry_device.reset_fused()
    t0 = time.perf_counter()
    ready = dry_device.fused_ready(device)
    results["probe"] = {"ready": ready, "seconds": round(time.perf_counter() - t0, 3)}
    print(f"probe: {_line(ready)} ({results['probe']['seconds']} s, compiles included)")
    ok = ready
    if not ready:
        return False, results
    results["bits"] = found = bits(device, batches)
    for r in found:
        good = r["vs_dense"] == 0 and r["vs_cpu"] == 0
        ok &= good
        print(f"bits: batch {r['batch']} drafts {r['drafts']} floors {r['floors']} {r['dtype']}: rows differing {r['vs_dense']} vs dense, "
              f"{r['vs_cpu']} vs CPU ({r['rows_lowered']} rows lowered): {_line(good)}")
    step, width, cap = make_case(64, 0, seed=5)
    on = _on(step, device)
    logits = on[0].clone()

    def fused() -> None:
        dry_device.fused_lower_(logits, *on[1:], width, cap)

    def dense() -> None:
        dense_lower_(logits, *on[1:], width, cap)

    fused()
    per_step, names = device_ops(fused, 10)
    dense_ops, _ = device_ops(dense, 10)
    results["kernels"] = {"fused": per_step, "names": names, "dense": dense_ops}
    good = per_step <= 2
    ok &= good
    print(f"kernels: {per_step:g} device ops a fused step ({', '.join(names)}), dense {dense_ops:g}: {_line(good)}")
    synced = sync_error(fused)
    results["sync"] = synced
    ok &= not synced
    print(f"sync: {_line(not synced)} {synced}")
    results["time"] = {"fused_ms": timed(fused, steps)[1], "dense_ms": timed(dense, steps)[1]}
    print(f"time: fused {results['time']['fused_ms']:.4f} ms, dense {results['time']['dense_ms']:.4f} ms a step "
          "(batch 64, W 2048, cap 160)")
    return ok, results


def cpu_check() -> bool:
    """``lower_window_`` against ``dense_lower_`` on the CPU (batches 1 and 16, W 512), then the same
    with the Triton kernel in the interpreter (a subprocess: ``TRITON_INTERPRET=1`` must be set
    before Triton is imported)."""
    ok = True
    for batch in (1, 16):
        for drafts, floored in ((0, False), (2, False), (2, True)):
            step, width, cap = make_case(batch, drafts, vocab=5000, width=512, seed=batch + drafts)
            floor = probe_floor(batch, step) if floored else None
            got, want = step[0].clone(), step[0].clone()
            lower_window_(got, *step[1:], width, cap, floor)
            dense_lower_(want, *step[1:], width, cap, floor)
            differing = _rows_differing(got, want)
            ok &= differing == 0
            print(f"cpu bits: batch {batch} drafts {drafts} floors {floored}: rows differing {differing}: "
                  f"{_line(differing == 0)}")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "dynlogits.testing.cuda.dry_check", "--interpreted-child"], env=env,
                          check=False)
    print(f"interpreted bits: {_line(done.returncode == 0)}")
    return ok and done.returncode == 0


def _interpreted_child() -> int:
    """The fused step's kernel (interpreter) against ``dense_lower_`` and ``lower_window_``, small."""
    found = bits(torch.device("cpu"), batches=(1, 4), vocab=3000, width=256, fused_step=dry_device._fused_lower_cuda)
    for r in found:
        print(f"  batch {r['batch']} drafts {r['drafts']} floors {r['floors']} {r['dtype']}: {r['vs_dense']} / {r['vs_cpu']} differing"
              f" ({r['rows_lowered']} rows lowered)")
    return 0 if all(r["vs_dense"] == 0 and r["vs_cpu"] == 0 for r in found) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.dry_check",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (no device figures)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--interpreted-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interpreted_child:
        return _interpreted_child()
    if args.cpu:
        ok = cpu_check()
    elif not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__}); --cpu runs the CPU self test", file=sys.stderr)
        return 2
    else:
        ok, _ = run(torch.device("cuda"), steps=args.steps)
    print("\nresult:", _line(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
