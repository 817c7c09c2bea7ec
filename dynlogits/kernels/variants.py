"""Kernel variants compiled off the engine step.

A Triton kernel compiles at its first launch with a new set of constexprs and argument types (a
*variant*: ``triton.runtime.jit.JITFunction.run`` -> ``_do_compile``, synchronous, hundreds of ms
on the caller's thread). A client's payload picks some (``no_repeat_ngram``'s ``SIZE``, a phrase
bucket), so the step that first holds one would stall every request of the batch.
``FusedGate.run(..., variant=, compile=)`` instead hands ``compile`` to ``COMPILER`` and runs the
eager path until it has landed.

``CompileThread``: one daemon thread running submitted jobs one at a time, in order, from a
bounded queue (``submit`` returns ``False`` when it is full: the caller asks again later); a job
that raises is logged and the thread goes on. Triton's passes and ``ptxas`` (a subprocess) run off
the GIL; the Python front end of a compile holds it for stretches of at most the interpreter's
switch interval while the step's thread asks for it.

``no_repeat_ngram(...)``: the ``(variant, compile)`` pair of one ``no_repeat_ngram`` launch, the
compile a ``JITFunction.warmup`` of that launch's specialization (torch dtypes in place of
tensors, the same ints and constexprs: Triton 3.6 and 3.9 accept both) on the launch's device."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Hashable

import torch

__all__ = ["COMPILER", "CompileThread", "int_class", "no_repeat_ngram"]

log = logging.getLogger("dynlogits.kernels")


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


def int_class(value: int) -> tuple[bool, bool]:
    """How Triton specializes an int argument it has not been told to leave alone: whether it is 1
    and whether it is a multiple of 16 (part of a variant's key, so a variant's compile matches the
    launch's)."""
    return value == 1, value % 16 == 0


def no_repeat_ngram(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
                    params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                    floor: torch.Tensor | None, width: int, size: int) -> tuple[Hashable, Callable[[], object]]:
    """``(variant, compile)`` of ``dynlogits.kernels.no_repeat_ngram.ban_`` for these arguments:
    ``variant`` its constexprs, argument dtypes and int classes; ``compile`` warms its kernel up on
    ``logits.device`` (Triton imported there, on the compile thread) and loads it onto the device."""
    drafts = input_ids is not None and local_pos is not None
    ids = input_ids if drafts and input_ids is not None else pos
    local = local_pos if drafts and local_pos is not None else pos
    fl = pos if floor is None else floor
    tensors = (logits.dtype, tokens.dtype, pos.dtype, slot_of_row.dtype, params.dtype, ids.dtype, local.dtype, fl.dtype)
    ints = (logits.stride(0), logits.stride(1), tokens.stride(0), tokens.stride(1), tokens.shape[1],
            params.stride(0), width, logits.shape[1])
    variant = ("no_repeat_ngram", size, drafts, floor is not None, tensors, tuple(int_class(i) for i in ints))
    device = logits.device

    def compile_() -> object:
        from dynlogits.kernels import no_repeat_ngram as kernels

        (l_s0, l_s1, t_s0, t_s1, maxlen, p_s0, w, vocab) = ints
        (l_t, t_t, pos_t, slot_t, params_t, ids_t, local_t, floor_t) = tensors
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            compiled = kernels.kernels().ban_rows.warmup(
                l_t, l_s0, l_s1, t_t, t_s0, t_s1, maxlen, pos_t, slot_t, params_t, p_s0, ids_t, local_t, floor_t, w,
                vocab, grid=(1,), SIZE=size, BLOCK=kernels.BLOCK, HAS_DRAFTS=drafts, HAS_FLOOR=floor is not None)
            init = getattr(compiled, "_init_handles", None)  # the module's load, else at the first launch
            if init is not None:
                init()
        return compiled

    return variant, compile_
