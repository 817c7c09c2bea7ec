"""``forced_sequence``'s fused settle (``dynlogits.kernels.forced``: what a steady forced step runs
on CUDA once ``forced_settle.fused_ready`` probed it; ``settle_`` on the V1 runner, ``pick_settle_``
under Model Runner V2) on a real CUDA device.

``run(device)`` (CUDA), per batch (1, 64, 256) and op, random settles (``forced_settle.probe_case``,
``pick_probe_case``: masked forced logits, rows with and without stop tokens, member rows in random
order), figures one line each:

* ``bits``: the kernels' logits, picks and dead rows against the eager reference on the same device
  and on host copies (differences, each must be 0), float32 and bfloat16;
* ``kernels``: device ops of one call from ``torch.profiler`` (must be 2) beside the eager ones;
* ``sync``: one call under ``torch.cuda.set_sync_debug_mode("error")`` (must raise nothing);
* ``time``: per call, the kernels and the eager reference (CUDA events), printed, not judged.

``python -m dynlogits.testing.cuda.forced_check --cpu`` is the CPU self test: the same ``bits``
with the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess) on small batches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynlogits.processors import forced_settle as F

from . import kernel_check
from .kernel_check import interpreted, line, measure

__all__ = ["BATCHES", "bits", "cpu_check", "main", "run"]

BATCHES = (1, 64, 256)
MODULE = "dynlogits.testing.cuda.forced_check"
OPS = ("settle", "pick_settle")
#: a call of one op: ``(impl, outputs)`` -> None, and fresh outputs (the logits' copy first)
Call = tuple[Callable[[Callable[..., None], tuple[torch.Tensor, ...]], None], Callable[[], tuple[torch.Tensor, ...]]]


def _call(op: str, batch: int, vocab: int, seed: int, device: torch.device, dtype: torch.dtype) -> Call:
    """One random call of ``op`` on ``device``."""
    if op == "settle":
        logits, rows, picked, if_dead, can_stop = F.probe_case(seed, device, rows=batch, vocab=vocab, stops=seed % 2 == 0)
        logits = logits.to(dtype)

        def settle(impl: Callable[..., None], out: tuple[torch.Tensor, ...]) -> None:
            impl(out[0], rows, picked, if_dead, can_stop, out[1], out[2])

        return settle, lambda: (logits.clone(), torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
    logits, rows, table, bounds, values, identity, can_stop = F.pick_probe_case(
        seed, device, rows=batch, vocab=vocab, width=65, identity=seed % 2 == 0, stops=seed % 3 > 0)
    logits = logits.to(dtype)

    def pick(impl: Callable[..., None], out: tuple[torch.Tensor, ...]) -> None:
        impl(out[0], rows, table, bounds, values, identity, can_stop, *out[1:])

    return pick, lambda: (logits.clone(), torch.empty((6, batch), dtype=torch.long, device=device),
                          torch.empty((3, batch), dtype=torch.long, device=device),
                          torch.empty(batch, dtype=torch.bool, device=device))


def _impls(op: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The op's kernels (``dynlogits.kernels.forced``) and its eager reference."""
    from dynlogits.kernels import forced as kernels

    return (kernels.settle_, F.settle_.eager) if op == "settle" else (kernels.pick_settle_, F.pick_settle_.eager)


def _to_cpu(call: Call, op: str) -> tuple[torch.Tensor, ...]:
    """The eager reference on host copies of the call's inputs."""
    run, fresh = call
    captured: list[Any] = []
    run(lambda *args: captured.extend(args), fresh())
    host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in captured]
    _impls(op)[1](*host)
    n_out = 3 if op == "settle" else 4
    return tuple(host[0:1]) + tuple(host[-(n_out - 1):])


def bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch, op and dtype: outputs where the kernels differ from the eager reference on
    ``device`` and on the host (each must be 0), and the dead rows seen."""
    found = []
    for batch in batches:
        for op in OPS:
            for dtype in (torch.float32, torch.bfloat16):
                call = _call(op, batch, vocab, 3000 + batch, device, dtype)
                fused_impl, eager_impl = _impls(op)
                fused, eager = call[1](), call[1]()
                call[0](fused_impl, fused)
                call[0](eager_impl, eager)
                host = _to_cpu(call, op)
                vs_eager = sum(not torch.equal(a.cpu(), b.cpu()) for a, b in zip(fused, eager))
                vs_host = sum(not torch.equal(a.cpu(), b) for a, b in zip(fused, host))
                dead = int(fused[-1].sum())
                name = str(dtype).removeprefix("torch.")
                found.append({"batch": batch, "op": op, "dtype": name, "vs_eager": vs_eager, "vs_host": vs_host,
                              "dead": dead})
                print(f"forced fused bits {op} batch {batch} {name} vocab {vocab}: vs eager {vs_eager}, vs host "
                      f"{vs_host} outputs differ ({dead} dead rows) -> {line(vs_eager == 0 and vs_host == 0)}",
                      flush=True)
    return found


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200,
        batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """Every figure of the module doc on a CUDA ``device``."""
    results: dict[str, Any] = {"bits": bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["vs_eager"] == 0 and r["vs_host"] == 0 for r in results["bits"])
    for batch in batches:
        for op in OPS:
            call = _call(op, batch, vocab, 5 + batch, device, torch.float32)
            fused_impl, eager_impl = _impls(op)
            out = call[1]()
            ok &= measure(results, "forced fused", {"op": op, "batch": batch},
                          lambda: call[0](fused_impl, out),  # noqa: B023  # called at once
                          lambda: call[0](eager_impl, out), steps, 2)  # noqa: B023  # called at once
    return ok, results


def cpu_check(vocab: int = 3001, batches: Sequence[int] = (1, 7, 40)) -> bool:
    """``bits`` on the CPU with the kernels in Triton's interpreter, in a subprocess."""
    return interpreted(MODULE, vocab, batches)


def main(argv: Sequence[str] | None = None) -> int:
    return kernel_check.main(argv, module=MODULE, doc=__doc__, bits=bits, run=run, counted="dead", cpu_vocab=3001,
                             cpu_batches=(1, 7, 40))


if __name__ == "__main__":
    sys.exit(main())
