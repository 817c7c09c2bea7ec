"""What each fused kernel's GPU check module shares (``forced_check``, ``dead_rows_check``,
``no_repeat_ngram_check``): the device figures of one kernel beside its eager path (``measure``:
device ops, no sync, time, each a printed line and a record), the CPU self test that runs the
module's ``bits`` with the kernels in Triton's interpreter in a subprocess (``interpreted``), and
the command line (``main``: ``--cpu`` for the self test, else the GPU run; exit 0 when every check
passed, 1 otherwise, 2 without CUDA). CUDA only but for ``interpreted`` and ``main``'s parsing."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .timing import device_ops, sync_error, timed

__all__ = ["interpreted", "line", "main", "measure"]

#: a module's ``bits(device, vocab, batches)``: one record per case, ``vs_eager``/``vs_host`` each 0 when equal
Bits = Callable[[torch.device, int, Sequence[int]], list[dict[str, Any]]]


def line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def measure(results: dict[str, Any], label: str, key: dict[str, Any], fused: Callable[[], object],
            eager: Callable[[], object], steps: int, most: int) -> bool:
    """``fused`` beside ``eager`` on CUDA: device ops a call (at most ``most``), no sync, time; one
    printed line and one record (tagged with ``key``) each in ``results["kernels"|"sync"|"time"]``.
    Whether the op count and the sync check passed."""
    fused()
    eager()
    f_ops, names = device_ops(fused, 10)
    e_ops, _ = device_ops(eager, 10)
    fits = f_ops <= most
    tag = " ".join(f"{k} {v}" for k, v in key.items())
    results["kernels"].append({**key, "fused": f_ops, "eager": e_ops, "names": names})
    print(f"{label} kernels {tag}: {f_ops:.1f} device ops {names} (eager {e_ops:.1f}) -> {line(fits)}", flush=True)
    error = sync_error(fused)
    results["sync"].append({**key, "error": error})
    print(f"{label} sync {tag}: {error or 'none'} -> {line(not error)}", flush=True)
    f_wall, f_dev = timed(fused, steps)
    e_wall, e_dev = timed(eager, steps)
    results["time"].append({**key, "fused_wall_ms": f_wall, "fused_device_ms": f_dev, "eager_wall_ms": e_wall,
                            "eager_device_ms": e_dev})
    print(f"{label} time {tag}: kernel {f_wall:.4f} ms wall, {f_dev:.4f} ms device; eager {e_wall:.4f} ms wall, "
          f"{e_dev:.4f} ms device", flush=True)
    return fits and not error


def interpreted(module: str, vocab: int, batches: Sequence[int]) -> bool:
    """``python -m module --interpreted-child`` with ``TRITON_INTERPRET=1`` (set before Triton is
    imported): the module's ``bits`` on the CPU with its kernels in Triton's interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", module, "--interpreted-child", "--vocab", str(vocab), "--batches",
                           ",".join(map(str, batches))], env=env, check=False)
    return done.returncode == 0


def main(argv: Sequence[str] | None, *, module: str, doc: str | None, bits: Bits,
         run: Callable[..., tuple[bool, dict[str, Any]]], counted: str, cpu_vocab: int,
         cpu_batches: Sequence[int]) -> int:
    """The check's command line (module doc). ``counted``: the ``bits`` record field that must sum
    above 0 in the self test (the cases did something: bans, dead rows, flags)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (Triton's interpreter, small batches)")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interpreted-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", default=",".join(map(str, cpu_batches)), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interpreted_child:  # in the interpreter (the parent set TRITON_INTERPRET=1)
        found = bits(torch.device("cpu"), args.vocab or cpu_vocab, [int(b) for b in args.batches.split(",")])
        same = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in found)
        return 0 if same and sum(r[counted] for r in found) > 0 else 1
    if args.cpu:
        ok = interpreted(module, args.vocab or cpu_vocab, cpu_batches)
    elif not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__}); --cpu runs the CPU self test", file=sys.stderr)
        return 2
    else:
        ok, _ = run(torch.device("cuda"), vocab=args.vocab or 151936, steps=args.steps)
    print("\nresult:", line(ok))
    return 0 if ok else 1
