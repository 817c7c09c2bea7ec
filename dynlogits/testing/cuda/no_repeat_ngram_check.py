"""``no_repeat_ngram``'s fused Triton kernel (``dynlogits.kernels.no_repeat_ngram``, what Model
Runner V2's steady step runs on CUDA once ``no_repeat_ngram_device.fused_ready`` probed it) on a real
CUDA device.

``run(device)`` (CUDA), per batch (1, 64, 256) and drafts (none, 2 a request): random steps
(``no_repeat_ngram_device.probe_case``: an engine matrix ``length`` wide of few ids, placeholders,
ids at and past the logits' width, prefill chunks' rows, non-members, sizes up to
``MAX_DEVICE_SIZE``, ``include_prompt`` or not), figures one line each:

* ``bits``: the kernel's logits against ``apply_eager`` on the same device and against the CPU
  implementation (``ban_host``) on the host copies (rows differing, each must be 0), float32 and
  bfloat16, without a floor and with a scoped entry's per-row floor (``probe_case``'s);
* ``kernels``: device ops (kernels, copies, memsets) of one steady call from ``torch.profiler``
  (must be 1) beside ``apply_eager``'s;
* ``sync``: one call under ``torch.cuda.set_sync_debug_mode("error")`` (must raise nothing);
* ``time``: per call, the kernel and ``apply_eager`` (CUDA events), printed, not judged.

``python -m dynlogits.testing.cuda.no_repeat_ngram_check --cpu`` is the CPU self test: the same
``bits`` comparison with the kernel in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess)
against ``ban_host`` and ``apply_eager`` on the CPU (small batches; no profiler, sync or time)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dynlogits.processors.no_repeat_ngram_device import Layout, apply_eager, ban_host, probe_case
from dynlogits.processors.window import TokenWindow

from .timing import device_ops, timed

__all__ = ["BATCHES", "bits", "interpreted_check", "main", "run"]

BATCHES = (1, 64, 256)
#: the engine matrix's width of the random steps
LENGTH = 512
DRAFTS = (0, 2)


def _case(batch: int, drafts: int, vocab: int, seed: int,
          device: torch.device) -> tuple[TokenWindow, Layout, torch.Tensor, torch.Tensor]:
    return probe_case(seed, device, rows=batch, slots=batch + 1, length=LENGTH, vocab=vocab, drafts=drafts)


def _fused(window: TokenWindow, t: Layout, logits: torch.Tensor, floor: torch.Tensor | None) -> None:
    from dynlogits.kernels import no_repeat_ngram as kernels

    drafted = window.input_ids is not None and window.local_pos is not None
    kernels.ban_(logits, window.tokens, window.pos, t.slot_of_row, t.source.params,
                 window.input_ids if drafted else None, window.local_pos if drafted else None, floor, t.source.width,
                 t.source.size)


def _host(window: TokenWindow, t: Layout, logits: torch.Tensor, floor: torch.Tensor | None) -> torch.Tensor:
    """``ban_host`` on host copies of the step."""
    drafted = window.input_ids is not None and window.local_pos is not None
    out = logits.cpu()
    ban_host(out, window.tokens.cpu(), window.pos.cpu(), t.slot_of_row.cpu(), t.source.params.cpu(),
             window.input_ids.cpu() if drafted and window.input_ids is not None else None,
             window.local_pos.cpu() if drafted and window.local_pos is not None else None,
             None if floor is None else floor.cpu(), t.source.width, t.source.size)
    return out


def _extremes(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device),
            torch.full((), float("inf"), dtype=logits.dtype, device=logits.device))


def _line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch, drafts, dtype and floor (none, or a scoped entry's per row): rows where the kernel
    differs from ``apply_eager`` on ``device`` and from ``ban_host`` on the host (each must be 0),
    and the bans made."""
    out = []
    for batch in batches:
        for drafts in DRAFTS:
            for dtype, floored in ((torch.float32, False), (torch.bfloat16, False), (torch.float32, True)):
                window, t, logits, floors = _case(batch, drafts, vocab, 1000 + batch + drafts, device)
                floor = floors if floored else None
                logits = logits.to(dtype)
                fused, eager = logits.clone(), logits.clone()
                _fused(window, t, fused, floor)
                apply_eager(window, t, eager, _extremes(eager), floor)
                host = _host(window, t, logits, floor)
                fused_cpu = fused.cpu()
                vs_eager = int((fused_cpu != eager.cpu()).any(1).sum())
                vs_host = int((fused_cpu != host).any(1).sum())
                banned = int(torch.isneginf(host).sum())
                name = str(dtype).removeprefix("torch.") + (" floored" if floored else "")
                out.append({"batch": batch, "drafts": drafts, "dtype": name, "vs_eager": vs_eager, "vs_host": vs_host,
                            "banned": banned})
                good = vs_eager == 0 and vs_host == 0
                print(f"no_repeat_ngram fused bits batch {batch} drafts {drafts} {name} vocab {vocab}: kernel vs eager "
                      f"{vs_eager} rows, vs host {vs_host} rows ({banned} bans) -> {_line(good)}", flush=True)
    return out


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in results["bits"])
    ok &= sum(r["banned"] for r in results["bits"]) > 0  # the steps banned something
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            for drafts in DRAFTS:
                window, t, logits, _ = _case(batch, drafts, vocab, 7 + batch, device)
                extremes = _extremes(logits)
                t.gathered  # noqa: B018  # the eager path's one-off gather, outside its steady step

                def fused() -> None:
                    _fused(window, t, logits, None)  # noqa: B023  # called at once

                def eager() -> None:
                    apply_eager(window, t, logits, extremes)  # noqa: B023  # called at once

                fused()
                eager()
                f_ops, f_names = device_ops(fused, 10, Path(tmp))
                e_ops, _ = device_ops(eager, 10, Path(tmp))
                fits = f_ops <= 1
                ok &= fits
                results["kernels"].append({"batch": batch, "drafts": drafts, "fused": f_ops, "eager": e_ops,
                                           "names": f_names})
                print(f"no_repeat_ngram fused kernels batch {batch} drafts {drafts}: {f_ops:.1f} device ops {f_names} "
                      f"(eager {e_ops:.1f}) -> {_line(fits)}", flush=True)
                sync_error = ""
                torch.cuda.set_sync_debug_mode("error")
                try:
                    fused()
                except RuntimeError as exc:
                    sync_error = str(exc).splitlines()[0][:200]
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                ok &= not sync_error
                results["sync"].append({"batch": batch, "drafts": drafts, "error": sync_error})
                print(f"no_repeat_ngram fused sync batch {batch} drafts {drafts}: {sync_error or 'none'} -> "
                      f"{_line(not sync_error)}", flush=True)
                f_wall, f_dev = timed(fused, steps)
                e_wall, e_dev = timed(eager, steps)
                results["time"].append({"batch": batch, "drafts": drafts, "fused_wall_ms": f_wall,
                                        "fused_device_ms": f_dev, "eager_wall_ms": e_wall, "eager_device_ms": e_dev})
                print(f"no_repeat_ngram fused time batch {batch} drafts {drafts}: kernel {f_wall:.4f} ms wall, "
                      f"{f_dev:.4f} ms device; eager {e_wall:.4f} ms wall, {e_dev:.4f} ms device", flush=True)
    return ok, results


def interpreted_check(vocab: int = 1003, batches: Sequence[int] = (1, 5, 33)) -> bool:
    """``bits`` on the CPU with the kernel in Triton's interpreter, in a subprocess
    (``TRITON_INTERPRET=1`` must be set before Triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "dynlogits.testing.cuda.no_repeat_ngram_check", "--interpreted-child",
                           "--vocab", str(vocab), "--batches", ",".join(map(str, batches))], env=env, check=False)
    return done.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.no_repeat_ngram_check",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (Triton's interpreter, small batches)")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interpreted-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", default="1,5,33", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interpreted_child:  # in the interpreter (the parent set TRITON_INTERPRET=1)
        batches = [int(b) for b in args.batches.split(",")]
        found = bits(torch.device("cpu"), args.vocab or 1003, batches)
        same = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in found)
        return 0 if same and sum(r["banned"] for r in found) > 0 else 1
    if args.cpu:
        ok = interpreted_check(args.vocab or 1003)
    elif not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__}); --cpu runs the CPU self test", file=sys.stderr)
        return 2
    else:
        ok, _ = run(torch.device("cuda"), vocab=args.vocab or 151936, steps=args.steps)
    print("\nresult:", _line(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
