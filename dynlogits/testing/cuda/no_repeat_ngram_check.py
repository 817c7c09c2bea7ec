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

import sys
from collections.abc import Sequence
from typing import Any

import torch

from dynlogits.processors.no_repeat_ngram_device import Layout, apply_eager, ban_host, probe_case
from dynlogits.processors.window import TokenWindow

from . import kernel_check
from .kernel_check import interpreted, line, measure

__all__ = ["BATCHES", "bits", "interpreted_check", "main", "run"]

BATCHES = (1, 64, 256)
MODULE = "dynlogits.testing.cuda.no_repeat_ngram_check"
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
                      f"{vs_eager} rows, vs host {vs_host} rows ({banned} bans) -> {line(good)}", flush=True)
    return out


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in results["bits"])
    ok &= sum(r["banned"] for r in results["bits"]) > 0  # the steps banned something
    for batch in batches:
        for drafts in DRAFTS:
            window, t, logits, _ = _case(batch, drafts, vocab, 7 + batch, device)
            extremes = _extremes(logits)
            t.gathered  # noqa: B018  # the eager path's one-off gather, outside its steady step
            ok &= measure(results, "no_repeat_ngram fused", {"batch": batch, "drafts": drafts},
                          lambda: _fused(window, t, logits, None),  # noqa: B023  # called at once
                          lambda: apply_eager(window, t, logits, extremes),  # noqa: B023  # called at once
                          steps, 1)
    return ok, results


def interpreted_check(vocab: int = 1003, batches: Sequence[int] = (1, 5, 33)) -> bool:
    """``bits`` on the CPU with the kernel in Triton's interpreter, in a subprocess."""
    return interpreted(MODULE, vocab, batches)


def main(argv: Sequence[str] | None = None) -> int:
    return kernel_check.main(argv, module=MODULE, doc=__doc__, bits=bits, run=run, counted="banned", cpu_vocab=1003,
                             cpu_batches=(1, 5, 33))


if __name__ == "__main__":
    sys.exit(main())
