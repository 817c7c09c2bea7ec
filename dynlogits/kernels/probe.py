"""Whether a kind's fused ops run on a device: a probe at first use, then a cached answer.

``FusedGate(name, probe)``: ``ready(device)`` is never true on the CPU (the eager path, no Triton),
always true on another non-CUDA device (the CUDA model ``SimCuda``, which counts the ops' declared
launches), and on CUDA true once ``probe(device)`` returned true: the first call per device runs it
(a small batch through the Triton kernels and through the eager reference on that device, compared
exactly; one host sync, at the caller's group creation). Triton missing, a kernel failing to compile
or launch, or a difference: one warning naming the kind and the reason, and the eager path for good
on that device. A request never fails for it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

__all__ = ["FusedGate"]

log = logging.getLogger("dynlogits.kernels")


class FusedGate:
    """One kind's probe-at-first-use gate (see the module doc); thread-safe."""

    def __init__(self, name: str, probe: Callable[[torch.device], bool]) -> None:
        self.name = name
        self._probe = probe
        self._ready: dict[torch.device, bool] = {}
        self._lock = threading.Lock()

    def ready(self, device: torch.device) -> bool:
        """Whether ``name``'s fused ops run on ``device`` (probing a CUDA device once)."""
        if device.type == "cpu":
            return False
        if device.type != "cuda":
            return True
        with self._lock:
            ready = self._ready.get(device)
            if ready is None:
                try:
                    ready = bool(self._probe(device))
                    reason = "the probe differs from the eager reference"
                except Exception as exc:  # no Triton, a compile or launch failure: eager
                    first = str(exc).splitlines()[0][:200] if str(exc) else ""
                    ready, reason = False, f"{type(exc).__name__}: {first}"
                if not ready:
                    log.warning("%s: the fused Triton kernels are off on %s (%s); running eagerly",
                                self.name, device, reason)
                self._ready[device] = ready
        return ready

    def reset(self) -> None:
        """Forget every device's probe (tests)."""
        with self._lock:
            self._ready.clear()
