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

A call site that names its launch's variant (``run(..., variant=, compile=)``: a hashable key of its
constexprs and argument types, and a callable compiling it; ``run_named(..., variant_of, *args)``
derives both from the launch's arguments, only where they are read) does not compile in the step: on CUDA
the first call of a variant on a device hands ``compile`` to a background thread
(``dynlogits.kernels.variants.COMPILER``) and runs ``eager()``, as every call does until the
compile has landed; then ``fused()``. A compile that raises: one warning naming the kind and the
variant, and ``eager()`` for that variant for good. Fused and eager write the same logits (the
probe compares them exactly), so which one a step runs changes no output.

Every gate is registered when made (``gates()``), so an engine can probe them all at load
(``dynlogits.sdk.resident.warm``) rather than in the step that first holds a kind."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

from .variants import COMPILER, CompileThread, VariantOf

__all__ = ["FusedGate", "gates"]

T = TypeVar("T")

log = logging.getLogger("dynlogits.kernels")

_GATES: weakref.WeakSet[FusedGate] = weakref.WeakSet()  # every gate alive in this process
_PENDING = object()  # a variant queued or compiling


class FusedGate:
    """One kind's probe-at-first-use gate (see the module doc); thread-safe."""

    def __init__(self, name: str, probe: Callable[[torch.device], bool], compiler: CompileThread | None = None,
                 widen: Callable[[torch.device, int], object] | None = None) -> None:
        self.name = name
        self._probe = probe
        #: the kind's compile of the variants the logits' width selects (``widen(device, vocab)``),
        #: run at engine load by ``dynlogits.sdk.resident.warm`` where the gate is on; ``None``: none
        self.widen = widen
        self._ready: dict[torch.device, bool] = {}
        # per (device, variant): _PENDING (queued or compiling), True (landed), False (failed: eager)
        self._variants: dict[tuple[torch.device, Hashable], bool | object] = {}
        self._compiler = COMPILER if compiler is None else compiler
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

    def run(self, device: torch.device, fused: Callable[[], T], eager: Callable[[], T], variant: Hashable = None,
            compile: Callable[[], object] | None = None) -> T:  # noqa: A002 (the variant's compile)
        """``fused()`` where ``ready(device)``, else ``eager()``; on CUDA with a ``variant`` and its
        ``compile``, ``eager()`` until that variant's compile has landed off the step (module doc).
        A ``fused()`` that raises on CUDA (a variant failing to compile) turns the kernels off on
        ``device`` (one warning) and ``eager()`` answers instead. Elsewhere (the CUDA model) an error
        propagates: it is a bug of the op."""
        if not self.ready(device):
            return eager()
        if device.type != "cuda":
            return fused()
        if variant is not None and compile is not None and not self._landed(device, variant, compile):
            return eager()
        try:
            return fused()
        except Exception as exc:  # compile or launch failure of a variant the probe did not see
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            with self._lock:
                self._ready[device] = False
            log.warning("%s: the fused Triton kernels are off on %s (%s: %s); running eagerly",
                        self.name, device, type(exc).__name__, first)
            return eager()

    def run_named(self, device: torch.device, fused: Callable[[], T], eager: Callable[[], T], variant_of: VariantOf,
                  *args: Any) -> T:
        """``run`` named by ``variant_of(*args)`` (a kernels module's ``variant``: the ``(variant,
        compile)`` of ``fused()``'s launches for those arguments), computed only where ``run`` reads
        it: on CUDA with the kernels on (none per step on the CPU, or after a failed probe)."""
        if device.type == "cuda" and self.ready(device):
            return self.run(device, fused, eager, *variant_of(*args))
        return self.run(device, fused, eager)

    def _landed(self, device: torch.device, variant: Hashable, compile: Callable[[], object]) -> bool:  # noqa: A002
        """Whether ``variant`` has compiled on ``device``; its first call queues ``compile`` (a full
        queue: asked again at a later call)."""
        key = (device, variant)
        with self._lock:
            state = self._variants.get(key)
            if state is True:
                return True
            if state is not None:  # pending or failed
                return False
            self._variants[key] = _PENDING

        def job() -> None:
            try:
                compile()
                landed = True
            except Exception as exc:  # the variant's compile failed: eager for it, for good
                first = str(exc).splitlines()[0][:200] if str(exc) else ""
                log.warning("%s: variant %r failed to compile on %s (%s: %s); running it eagerly", self.name,
                            variant, device, type(exc).__name__, first)
                landed = False
            with self._lock:
                if self._variants.get(key) is _PENDING:  # not reset meanwhile
                    self._variants[key] = landed

        if not self._compiler.submit(job):
            with self._lock:
                self._variants.pop(key, None)
        return False

    def reset(self) -> None:
        """Forget every device's probe and every variant's compile (tests)."""
        with self._lock:
            self._ready.clear()
            self._variants.clear()


def gates() -> tuple[FusedGate, ...]:
    """Every live ``FusedGate`` of this process, by name (a module's gates register on its import)."""
    return tuple(sorted(_GATES, key=lambda gate: gate.name))
