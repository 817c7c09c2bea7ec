"""Every fused kernel compiled at engine load: ``warm(device, vocab)``.

A kind's fused Triton kernels are probed at first use (``dynlogits.kernels.probe``): a compile and
one host sync. Left to first use, that happens in the engine step whose batch first holds the kind,
and every request in that batch waits for it. ``SlotBatch`` calls ``warm`` when it is made on a CUDA
device (at engine load), so no request's step pays for a probe: it imports every module of
``dynlogits.kernels`` and ``dynlogits.processors`` (a gate registers when its module is imported; a
plug-in's when the plug-in is loaded) and probes each gate on the device. ``DYN_LOGITS_WARM_KERNELS=0``
leaves probing to first use.

Compiled at load, and reused by every later step whatever its batch, window, entry counts, vocab or
offset views (no kernel keys a variant on a runtime int or an address:
``tests/kernels/test_kernel_specialization.py``): each probe's variants, i.e. its constexpr values and
tensor dtypes (float32 logits among each probe's, as vLLM's sampler casts logits to float32 before the
processors: ``vllm/v1/sample/sampler.py``, ``Sampler.forward``, vLLM 0.32), and with ``vocab`` (the
logits' width) what each gate's ``widen`` compiles for that width (``compile_for_vocab``; today the
watermark draw's block count, ``draw_reduce``'s ``NB``, for one float32 row with the engine's flags).

Beyond the probes' values, a variant a request selects (a constexpr the client chooses: the n-gram
size, a phrase or choice length bucket, dry's tail and breaker buckets, a span delimiter width; or
another dtype) compiles at its first call, once per process, off the step: each fused op names its
variant to its gate, which runs the kind's eager path until the compile lands
(``dynlogits.kernels.variants``). Still compiled in the step of its first call: the watermark's
context width (``WIDE``/``WIDTH``, the operator's)."""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import time

import torch

from dynlogits.kernels.probe import gates

__all__ = ["WARM_ENV", "compile_for_vocab", "import_gate_modules", "warm"]

#: ``0`` leaves the probes to each kind's first use
WARM_ENV = "DYN_LOGITS_WARM_KERNELS"

log = logging.getLogger("dynlogits.kernels")


def import_gate_modules() -> None:
    """Import every public module of ``dynlogits.kernels`` and ``dynlogits.processors`` (their
    ``FusedGate`` instances register on import); one that fails to import is logged and skipped."""
    import dynlogits.kernels
    import dynlogits.processors

    for package in (dynlogits.kernels, dynlogits.processors):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if info.name.rsplit(".", 1)[1].startswith("_"):  # Triton sources: imported by their module
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # a missing optional dependency: that module's kernels stay unprobed
                log.warning("%s: not imported for the kernel warm-up (%s: %s)", info.name, type(exc).__name__, exc)


def compile_for_vocab(device: torch.device, vocab: int, ready: dict[str, bool]) -> list[str]:
    """Run, on ``device``, each registered gate's ``widen`` (the kind's compile of the variants the
    logits' width ``vocab`` selects) where ``ready`` has the gate on: the names compiled. A failure is
    logged and left to the first step (where the gate turns the kernels off)."""
    done: list[str] = []
    for gate in gates():
        if gate.widen is None or not ready.get(gate.name):
            continue
        try:
            gate.widen(device, vocab)
            done.append(gate.name)
        except Exception as exc:  # left to the first step: the gate handles a failure there
            log.warning("%s: the kernels for vocab %d not compiled at load (%s: %s)", gate.name, vocab,
                        type(exc).__name__, exc)
    return done


def warm(device: torch.device, vocab: int | None = None) -> dict[str, bool] | None:
    """Probe every registered gate on ``device`` now, then (with ``vocab``, the logits' width) compile
    the variants that width selects (``compile_for_vocab``): ``{gate name: fused kernels on}``; ``None``
    (and nothing done) off CUDA or with ``DYN_LOGITS_WARM_KERNELS=0``. Never raises for a kernel: a
    probe that fails turns that kind's kernels off, as at first use."""
    if device.type != "cuda" or os.environ.get(WARM_ENV, "1").strip() == "0":
        return None
    import_gate_modules()
    every = gates()
    log.info("probing %d kinds' fused kernels on %s (each compiles once per process; %s=0 defers this "
             "to each kind's first request)", len(every), device, WARM_ENV)
    start = time.perf_counter()
    ready = {gate.name: gate.ready(device) for gate in every}
    if vocab is not None:
        compile_for_vocab(device, vocab, ready)
    off = sorted(name for name, on in ready.items() if not on)
    log.info("fused kernels on %s: %d of %d on in %.1f s%s", device, len(ready) - len(off), len(ready),
             time.perf_counter() - start, f" (eager: {', '.join(off)})" if off else "")
    return ready
