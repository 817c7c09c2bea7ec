"""Whether a kind's fused ops run on a device: a probe at first use, then a cached answer.

``FusedGate(name, probe)``: ``ready(device)`` is never true on the CPU (the eager path, no Triton),
always true on another non-CUDA device (the CUDA model ``SimCuda``, which counts the ops' declared
launches), and on CUDA true once ``probe(device)`` returned true: the first call per device runs it
(a small batch through the Triton kernels and through the eager reference on that device, compared
exactly; one host sync, at the caller's group creation). Triton missing, a kernel failing to compile
or launch, or a difference: one warning naming the kind and the reason, and the eager path for good
on that device. A kernel variant the probe did not compile (another constexpr) compiles at its
first call: ``run`` catches a failure there too (before any launch: Triton compiles first), turns
the kernels off on that device with one warning and runs the eager path for that call and after.
A request never fails for it.

Every gate is registered when made (``gates()``), so an engine can probe them all at load
(``dynlogits.sdk.resident.warm``) rather than in the step that first holds a kind."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch

__all__ = ["FusedGate", "gates"]

T = TypeVar("T")

log = logging.getLogger("dynlogits.kernels")

_GATES: weakref.WeakSet[FusedGate] = weakref.WeakSet()  # every gate alive in this process


class FusedGate:
    """One kind's probe-at-first-use gate (see the module doc); thread-safe."""

    def __init__(self, name: str, probe: Callable[[torch.device], bool]) -> None:
        self.name = name
        self._probe = probe
        self._ready: dict[torch.device, bool] = {}
        self._lock = threading.Lock()
        _GATES.add(self)

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

    def run(self, device: torch.device, fused: Callable[[], T], eager: Callable[[], T]) -> T:
        """``fused()`` where ``ready(device)``, else ``eager()``; a ``fused()`` that raises on CUDA (a
        variant failing to compile) turns the kernels off on ``device`` (one warning) and ``eager()``
        answers instead. Elsewhere (the CUDA model) an error propagates: it is a bug of the op."""
        if not self.ready(device):
            return eager()
        if device.type != "cuda":
            return fused()
        try:
            return fused()
        except Exception as exc:  # compile or launch failure of a variant the probe did not see
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            with self._lock:
                self._ready[device] = False
            log.warning("%s: the fused Triton kernels are off on %s (%s: %s); running eagerly",
                        self.name, device, type(exc).__name__, first)
            return eager()

    def reset(self) -> None:
        """Forget every device's probe (tests)."""
        with self._lock:
            self._ready.clear()


def gates() -> tuple[FusedGate, ...]:
    """Every live ``FusedGate`` of this process, by name (a module's gates register on its import)."""
    return tuple(sorted(_GATES, key=lambda gate: gate.name))
