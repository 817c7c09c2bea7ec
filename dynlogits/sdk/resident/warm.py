"""Every fused kernel probed at engine load: ``warm(device)``.

A kind's fused Triton kernels are probed at first use (``dynlogits.kernels.probe``): a compile and
one host sync. Left to first use, that happens in the engine step whose batch first holds the kind,
and every request in that batch waits for it. ``SlotBatch`` calls ``warm`` when it is made on a CUDA
device (at engine load), so no request's step pays for a probe: it imports every module of
``dynlogits.kernels`` and ``dynlogits.processors`` (a gate registers when its module is imported; a
plug-in's when the plug-in is loaded) and probes each gate on the device. ``DYN_LOGITS_WARM_KERNELS=0``
leaves probing to first use. Kernel variants of client-chosen sizes (an n-gram size, a delimiter
width) still compile at their first call, once per process each (their sizes are bounded by the limits)."""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import time

import torch

from dynlogits.kernels.probe import gates

__all__ = ["WARM_ENV", "import_gate_modules", "warm"]

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


def warm(device: torch.device) -> dict[str, bool] | None:
    """Probe every registered gate on ``device`` now: ``{gate name: fused kernels on}``; ``None`` (and
    nothing done) off CUDA or with ``DYN_LOGITS_WARM_KERNELS=0``. Never raises for a kernel: a probe
    that fails turns that kind's kernels off, as at first use."""
    if device.type != "cuda" or os.environ.get(WARM_ENV, "1").strip() == "0":
        return None
    import_gate_modules()
    every = gates()
    log.info("probing %d kinds' fused kernels on %s (each compiles once per process; %s=0 defers this "
             "to each kind's first request)", len(every), device, WARM_ENV)
    start = time.perf_counter()
    ready = {gate.name: gate.ready(device) for gate in every}
    off = sorted(name for name, on in ready.items() if not on)
    log.info("fused kernels on %s: %d of %d on in %.1f s%s", device, len(ready) - len(off), len(ready),
             time.perf_counter() - start, f" (eager: {', '.join(off)})" if off else "")
    return ready
