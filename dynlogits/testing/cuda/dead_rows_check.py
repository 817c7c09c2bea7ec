"""The restrictive groups' fused dead-row epilogue (``dynlogits.kernels.dead_rows``: what
``Failures.record_dead`` runs on CUDA for a group's ``Dead`` once ``dead_rows.GATE`` probed it) on a
real CUDA device.

``run(device)`` (CUDA), per batch (1, 64, 256) and layout (listed, gathered), random cases
(``dead_rows.probe_case``: dead and live rows, NaN witnesses, stop tokens inside the witness, rows
without a stop token, rows sharing a slot, draft rows), figures one line each:

* ``bits``: the kernel's logits and flags against the eager reference on the same device and on
  host copies (differences, each must be 0), float32 and bfloat16, with and without positions,
  stop flags and drafts;
* ``kernels``: device ops of one call from ``torch.profiler`` (must be 1) beside the eager ones;
* ``sync``: one call under ``torch.cuda.set_sync_debug_mode("error")`` (must raise nothing);
* ``time``: per call, the kernel and the eager reference (CUDA events), printed, not judged.

``python -m dynlogits.testing.cuda.dead_rows_check --cpu`` is the CPU self test: the same ``bits``
with the kernel in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess) on small batches."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import torch

from dynlogits.kernels import dead_rows as D

from .timing import device_ops, sync_error, timed

__all__ = ["BATCHES", "bits", "cpu_check", "main", "run"]

BATCHES = (1, 64, 256)
LAYOUTS = ("listed", "gathered")
#: one variant of a case: (positions, stop flags or rows touched, drafts)
VARIANTS = ((True, True, False), (False, False, True), (True, False, True), (False, True, False))


def _case(layout: str, batch: int, vocab: int, seed: int, device: torch.device, dtype: torch.dtype,
          variant: tuple[bool, bool, bool]) -> tuple[Any, ...]:
    positions, stops, real = variant
    return D.probe_case(seed, device, listed=layout == "listed", rows=batch, vocab=vocab, width=64,
                        slots=max(2, batch // 2), positions=positions, stops=stops, real=real, dtype=dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return torch.equal(a, b)


def _line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch, layout, dtype and variant: outputs where the kernel differs from the eager
    reference on ``device`` and on the host (each must be 0), and the slots flagged."""
    found = []
    for batch in batches:
        for layout in LAYOUTS:
            for dtype in (torch.float32, torch.bfloat16):
                for k, variant in enumerate(VARIANTS):
                    case = _case(layout, batch, vocab, 3000 + batch + k, device, dtype, variant)
                    fused = D.apply(D.launch, case)
                    eager = D.apply(D.record_reference, case)
                    host = D.apply(D.record_reference, tuple(t.cpu() if isinstance(t, torch.Tensor) else t
                                                            for t in case))
                    vs_eager = sum(not _same(a, b) for a, b in zip(fused, eager))
                    vs_host = sum(not _same(a, b) for a, b in zip(fused, host))
                    flagged = int((fused[1] != case[-1]).sum())
                    name = str(dtype).removeprefix("torch.")
                    found.append({"batch": batch, "layout": layout, "dtype": name, "variant": variant,
                                  "vs_eager": vs_eager, "vs_host": vs_host, "flagged": flagged})
                    print(f"dead rows bits {layout} batch {batch} {name} {variant}: vs eager {vs_eager}, vs host "
                          f"{vs_host} outputs differ ({flagged} slots flagged) -> "
                          f"{_line(vs_eager == 0 and vs_host == 0)}", flush=True)
    return found


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in results["bits"])
    for batch in batches:
        for layout in LAYOUTS:
            case = _case(layout, batch, vocab, 5 + batch, device, torch.float32, VARIANTS[2])
            logits, flags = case[0].clone(), case[-1].clone()

            def fused() -> None:
                D.apply(D.launch, case, logits, flags)  # noqa: B023  # called at once

            def eager() -> None:
                D.apply(D.record_reference, case, logits, flags)  # noqa: B023  # called at once

            fused()
            eager()
            f_ops, names = device_ops(fused, 10)
            e_ops, _ = device_ops(eager, 10)
            fits = f_ops <= 1
            ok &= fits
            results["kernels"].append({"batch": batch, "layout": layout, "fused": f_ops, "eager": e_ops,
                                       "names": names})
            print(f"dead rows kernels {layout} batch {batch}: {f_ops:.1f} device ops {names} (eager {e_ops:.1f}) "
                  f"-> {_line(fits)}", flush=True)
            error = sync_error(fused)
            ok &= not error
            results["sync"].append({"batch": batch, "layout": layout, "error": error})
            print(f"dead rows sync {layout} batch {batch}: {error or 'none'} -> {_line(not error)}", flush=True)
            f_wall, f_dev = timed(fused, steps)
            e_wall, e_dev = timed(eager, steps)
            results["time"].append({"batch": batch, "layout": layout, "fused_wall_ms": f_wall,
                                    "fused_device_ms": f_dev, "eager_wall_ms": e_wall, "eager_device_ms": e_dev})
            print(f"dead rows time {layout} batch {batch}: kernel {f_wall:.4f} ms wall, {f_dev:.4f} ms device; "
                  f"eager {e_wall:.4f} ms wall, {e_dev:.4f} ms device", flush=True)
    return ok, results


def cpu_check(vocab: int = 3001, batches: Sequence[int] = (1, 7, 40)) -> bool:
    """``bits`` on the CPU with the kernel in Triton's interpreter, in a subprocess
    (``TRITON_INTERPRET=1`` must be set before Triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "dynlogits.testing.cuda.dead_rows_check", "--interpreted-child",
                           "--vocab", str(vocab), "--batches", ",".join(map(str, batches))], env=env, check=False)
    return done.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.dead_rows_check",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (Triton's interpreter, small batches)")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interpreted-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", default="1,7,40", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interpreted_child:  # in the interpreter (the parent set TRITON_INTERPRET=1)
        found = bits(torch.device("cpu"), args.vocab or 3001, [int(b) for b in args.batches.split(",")])
        same = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in found)
        return 0 if same and sum(r["flagged"] for r in found) > 0 else 1
    if args.cpu:
        ok = cpu_check(args.vocab or 3001)
    elif not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__}); --cpu runs the CPU self test", file=sys.stderr)
        return 2
    else:
        ok, _ = run(torch.device("cuda"), vocab=args.vocab or 151936, steps=args.steps)
    print("\nresult:", _line(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
