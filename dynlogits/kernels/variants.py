"""Kernel variants compiled off the engine step.

A Triton kernel compiles at its first launch with a new set of constexprs and argument types (a
*variant*: ``triton.runtime.jit.JITFunction.run`` -> ``_do_compile``, synchronous, hundreds of ms
on the caller's thread). A client's payload picks some (``no_repeat_ngram``'s ``SIZE``, a phrase
bucket), so the step that first holds one would stall every request of the batch.
``FusedGate.run(..., variant=, compile=)`` (or ``run_named(..., variant_of, *args)``, which derives
the pair from the launch's arguments) instead hands ``compile`` to ``COMPILER`` and runs the eager
path until it has landed.

``CompileThread``: one daemon thread running submitted jobs one at a time, in order, from a
bounded queue (``submit`` returns ``False`` when it is full: the caller asks again later); a job
that raises is logged and the thread goes on. Most of a compile (Triton's MLIR passes, ``ptxas``
in a subprocess) leaves the GIL to the step's thread; the Python front end holds it in stretches,
so a step can still wait tens of ms for it, against the whole compile (hundreds of ms) in the step.

``launch_variant``: the ``(variant, compile)`` pair of one launch, the compile a
``JITFunction.warmup`` of that launch's specialization (torch dtypes in place of tensors, the same
ints and constexprs: Triton 3.6 and 3.9 accept both) on the launch's device; ``launches_variant``:
one pair for an op of several launches; each kind's pair for its launch arguments: its kernel
module's ``variant`` (from the ``launch_args`` its launch takes, so the compile warms exactly what
the launch will look up)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

__all__ = ["COMPILER", "CompileThread", "Named", "VariantOf", "jitted", "launch_variant", "launches_variant",
           "meta_scratch"]

log = logging.getLogger("dynlogits.kernels")

#: a fused op's ``(variant, compile)``: the key of its launches' specializations, and their compile
Named = tuple[Hashable, Callable[[], object]]
#: a kernels module's ``variant``: the op's ``Named`` for the arguments its launches take
VariantOf = Callable[..., Named]


class CompileThread:
    """One daemon thread running jobs one at a time (see the module doc); thread-safe."""

    def __init__(self, capacity: int = 64, name: str = "dynlogits-compile") -> None:
        self._queue: queue.Queue[Callable[[], object]] = queue.Queue(maxsize=capacity)
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._unfinished = 0  # jobs queued or running

    def submit(self, job: Callable[[], object]) -> bool:
        """Queue ``job`` (the thread starts at the first); ``False`` where the queue is full."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                return False
            self._unfinished += 1
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every job submitted so far has run, at most ``timeout`` seconds; whether they
        have (tests, an engine's shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except Exception:  # a job's own failure: logged, the thread goes on
                log.exception("%s: a compile job failed", self._name)
            finally:
                with self._idle:
                    self._unfinished -= 1
                    self._idle.notify_all()


#: the process's compile thread (every ``FusedGate`` submits to it unless given another)
COMPILER = CompileThread()


_UNKEYED: dict[int, tuple[object, frozenset[int]]] = {}  # id(kernel) -> (kernel, its unkeyed positions)


def _unkeyed(kernel: object) -> frozenset[int]:
    """The argument positions ``kernel`` leaves out of Triton's key (its params'
    ``do_not_specialize``); none for an object without ``params``. Cached per kernel object."""
    found = _UNKEYED.get(id(kernel))
    if found is None or found[0] is not kernel:
        params = getattr(kernel, "params", ())
        found = (kernel, frozenset(i for i, p in enumerate(params) if getattr(p, "do_not_specialize", False)))
        _UNKEYED[id(kernel)] = found
    return found[1]


def launch_variant(name: str, kernel: Callable[[], Any], device: torch.device, args: tuple[object, ...],
                   constexprs: dict[str, object]) -> tuple[Hashable, Callable[[], object]]:
    """``(variant, compile)`` of one launch of ``kernel()`` (a ``JITFunction``) with ``args``
    (positional, as launched) and ``constexprs``: ``variant`` the constexprs, each tensor's dtype
    and the class of each int the kernel lets Triton key (not in its ``do_not_specialize``: whether
    it is 1, whether a multiple of 16), so an int Triton ignores never makes a new variant;
    ``compile`` a ``warmup`` of that specialization on ``device`` (torch dtypes in
    place of tensors), then its module loaded onto the device."""
    plain = tuple([a.dtype if isinstance(a, torch.Tensor) else a for a in args])
    unkeyed = _unkeyed(kernel())
    classes = tuple([a if type(a) is not int else None if i in unkeyed else (a == 1, a % 16 == 0)
                     for i, a in enumerate(plain)])  # Triton's int classes, where it keys them
    variant = (name, *constexprs.values(), classes)  # the constexprs in the kind's fixed order

    def compile_() -> object:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            compiled = kernel().warmup(*plain, grid=(1,), **constexprs)
            init = getattr(compiled, "_init_handles", None)  # the module's load, else at the first launch
            if init is not None:
                init()
        return compiled

    return variant, compile_


def launches_variant(pairs: Sequence[tuple[Hashable, Callable[[], object]]]) -> tuple[Hashable, Callable[[], object]]:
    """One ``(variant, compile)`` for an op of several launches (each its ``launch_variant`` pair,
    in launch order): the tuple of their variants, and a compile warming each in turn."""
    compiles = [compile_ for _, compile_ in pairs]

    def compile_all() -> object:
        return [compile_() for compile_ in compiles]

    return tuple([variant for variant, _ in pairs]), compile_all


def jitted(kernels: Callable[[], Any], name: str) -> Callable[[], Any]:
    """The jitted kernel ``name`` of the module ``kernels()`` returns, looked up at the call (Triton
    imported then)."""
    return lambda: getattr(kernels(), name)


_META: dict[torch.dtype, torch.Tensor] = {}


def meta_scratch(dtype: torch.dtype) -> torch.Tensor:
    """A kept ``[1, 1]`` meta tensor of ``dtype`` (a scratch argument whose dtype alone is keyed)."""
    made = _META.get(dtype)
    if made is None:
        made = _META[dtype] = torch.empty((1, 1), dtype=dtype, device="meta")
    return made
