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

import sys
from collections.abc import Sequence
from typing import Any

import torch

from dynlogits.kernels import dead_rows as D

from . import kernel_check
from .kernel_check import interpreted, line, measure

__all__ = ["BATCHES", "bits", "cpu_check", "main", "run"]

BATCHES = (1, 64, 256)
MODULE = "dynlogits.testing.cuda.dead_rows_check"
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
                          f"{line(vs_eager == 0 and vs_host == 0)}", flush=True)
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
            ok &= measure(results, "dead rows", {"layout": layout, "batch": batch},
                          lambda: D.apply(D.launch, case, logits, flags),  # noqa: B023  # called at once
                          lambda: D.apply(D.record_reference, case, logits, flags),  # noqa: B023  # called at once
                          steps, 1)
    return ok, results


def cpu_check(vocab: int = 3001, batches: Sequence[int] = (1, 7, 40)) -> bool:
    """``bits`` on the CPU with the kernel in Triton's interpreter, in a subprocess."""
    return interpreted(MODULE, vocab, batches)


def main(argv: Sequence[str] | None = None) -> int:
    return kernel_check.main(argv, module=MODULE, doc=__doc__, bits=bits, run=run, counted="flagged", cpu_vocab=3001,
                             cpu_batches=(1, 7, 40))


if __name__ == "__main__":
    sys.exit(main())
