"""Processors with the time of their engine-facing calls counted, for the ``engine`` suite.

``TimedVllmLogitsProcessor`` is ``DynamoVllmLogitsProcessor`` whose ``update_state`` and
``apply`` add their wall time (ns) and a call count to ``CallTimes``: int64 counters in a file
named by ``CALL_TIMES_ENV``, mapped shared, so the process that drives ``vllm.LLM`` reads what
the engine core's process spent inside the adapter without an RPC. The cost it adds per call is
two ``perf_counter_ns`` and one 40-byte read and write. Load it as ``engine.TIMED_FQCN``; with
the variable unset it counts nothing.

``TimedFloorProcessor`` is the micro suite's ``floor`` inside the engine: a V1 logits processor
that fills the rows of the requests whose ``extra_args`` carry ``FLOOR_MARKER`` (a payload-free
marker no other processor reads) with ``-inf``, the least any exact forcing writes, one
``fill_(-inf)`` of the logits when those rows are the whole batch (as the micro ``floor``), else
one ``index_fill_`` of them; timed the same way into ``FLOOR_TIMES_ENV``'s file. Its rows then
argmax to id 0 (``torch.argmax`` takes the first of equal maxima), which is what the engine
worker checks.

``CallTimes`` also holds a label the driving process writes before each batch (the index of the
batch's kind); with ``PROFILE_ENV`` naming a folder, the timed adapter runs ``cProfile`` around its
calls, one profile per label, written to ``<folder>/<label>.prof`` whenever the label changes
(the worker ends with a label of its own, so the last batch's is written too). With
``SECTIONS_ENV`` too (comma-separated ``module:qualname`` of functions or methods, e.g.
``dynlogits.processors.forced_sequence:fill_rows``: a module's global is patched where that
module looks it up) it times those functions instead (two clock reads a call, no cProfile), and
writes ``<folder>/sections.json``: per label, per section, ns and calls, and the engine process's
``torch.get_num_threads()``."""

from __future__ import annotations

import cProfile
import functools
import importlib
import inspect
import json
import math
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

from .profile_env import PROFILE_ENV, SECTIONS_ENV

__all__ = ["CALL_TIMES_ENV", "FLOOR_MARKER", "FLOOR_TIMES_ENV", "PROFILE_ENV", "SECTIONS_ENV", "CallTimes",
           "TimedFloorProcessor", "TimedVllmLogitsProcessor"]

#: The file the adapter's counters live in (created by the reader before the engine starts).
CALL_TIMES_ENV = "DYNLOGITS_BENCH_CALL_TIMES"
#: The file the floor processor's counters live in.
FLOOR_TIMES_ENV = "DYNLOGITS_BENCH_FLOOR_TIMES"
#: The ``extra_args`` key that puts a request's row under ``TimedFloorProcessor`` (its value is ignored).
FLOOR_MARKER = "dynlogits_bench_floor"

#: ns in update_state, its calls, ns in apply, its calls, the driver's label of the current batch
_LAYOUT = struct.Struct("<qqqqq")


class CallTimes:
    """Cumulative counters (ns and calls of ``update_state``, ns and calls of ``apply``) and a batch
    label, shared between processes through one mapped file."""

    __slots__ = ("_map",)

    def __init__(self, path: str | Path, *, create: bool = False) -> None:
        if create:
            Path(path).write_bytes(bytes(_LAYOUT.size))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), _LAYOUT.size)

    def add(self, ns: int, *, apply: bool = False) -> None:
        """Count one call of ``ns`` nanoseconds (``apply``: an ``apply`` call, else ``update_state``)."""
        values = list(_LAYOUT.unpack_from(self._map))
        at = 2 if apply else 0
        values[at] += ns
        values[at + 1] += 1
        _LAYOUT.pack_into(self._map, 0, *values)

    def read(self) -> tuple[int, int]:
        """(ns spent in the calls, number of calls) so far, both kinds of call together."""
        update_ns, updates, apply_ns, applies, _ = _LAYOUT.unpack_from(self._map)
        return int(update_ns + apply_ns), int(updates + applies)

    def split(self) -> tuple[int, int, int, int]:
        """(ns in ``update_state``, its calls, ns in ``apply``, its calls) so far."""
        update_ns, updates, apply_ns, applies, _ = _LAYOUT.unpack_from(self._map)
        return int(update_ns), int(updates), int(apply_ns), int(applies)

    @property
    def label(self) -> int:
        return int(_LAYOUT.unpack_from(self._map)[4])

    @label.setter
    def label(self, value: int) -> None:
        values = list(_LAYOUT.unpack_from(self._map))
        values[4] = value
        _LAYOUT.pack_into(self._map, 0, *values)


class _Profiles:
    """cProfile around the timed calls, one profile per batch label, each written when the label changes."""

    def __init__(self, folder: str, times: CallTimes) -> None:
        self._folder, self._times = Path(folder), times
        self._folder.mkdir(parents=True, exist_ok=True)
        self._profiles: dict[int, cProfile.Profile] = {}
        self._label: int | None = None

    def current(self) -> cProfile.Profile:
        label = self._times.label
        if label != self._label:
            if self._label is not None:
                self._profiles[self._label].dump_stats(self._folder / f"{self._label}.prof")
            self._label = label
        return self._profiles.setdefault(label, cProfile.Profile())


class _Sections:
    """Named functions timed per batch label (``SECTIONS_ENV``), written on every label change."""

    def __init__(self, folder: str, times: CallTimes, targets: str) -> None:
        self._path, self._times = Path(folder) / "sections.json", times
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._spent: dict[int, dict[str, list[int]]] = {}
        self._label: int | None = None
        for target in filter(None, (t.strip() for t in targets.split(","))):
            self._patch(target)

    def _patch(self, target: str) -> None:
        module_name, _, qualname = target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        static = inspect.getattr_static(owner, name)
        original = getattr(owner, name)
        spent = self._spent

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                cell = spent.setdefault(self._times.label, {}).setdefault(target, [0, 0])
                cell[0] += time.perf_counter_ns() - start
                cell[1] += 1

        wrapped: Callable[..., Any] | staticmethod[Any, Any] = timed
        if isinstance(static, staticmethod):
            wrapped = staticmethod(timed)
        setattr(owner, name, wrapped)

    def check_label(self) -> None:
        label = self._times.label
        if label != self._label:
            if self._label is not None:
                self._path.write_text(json.dumps({"threads": torch.get_num_threads(),
                                                  "spent": {str(k): v for k, v in self._spent.items()}}))
            self._label = label


class TimedVllmLogitsProcessor(DynamoVllmLogitsProcessor):
    """``DynamoVllmLogitsProcessor`` counting the wall time of ``update_state`` and ``apply``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(CALL_TIMES_ENV)
        self._times = CallTimes(path) if path else None
        folder = os.environ.get(PROFILE_ENV)
        sections = os.environ.get(SECTIONS_ENV)
        on = bool(folder) and self._times is not None
        self._sections = _Sections(folder, self._times, sections) if on and sections else None  # type: ignore[arg-type]
        self._profiles = _Profiles(folder, self._times) if on and not sections else None  # type: ignore[arg-type]

    def update_state(self, batch_update: Any) -> None:
        if self._sections is not None:
            self._sections.check_label()
        profile = self._profiles.current() if self._profiles is not None else None
        start = time.perf_counter_ns()
        try:
            if profile is None:
                super().update_state(batch_update)
            else:
                profile.runcall(super().update_state, batch_update)
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start)

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        profile = self._profiles.current() if self._profiles is not None else None
        start = time.perf_counter_ns()
        try:
            return super().apply(logits, ctx) if profile is None else profile.runcall(super().apply, logits, ctx)
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start, apply=True)


class TimedFloorProcessor(LogitsProcessor):
    """The micro ``floor`` in a V1 engine: ``-inf`` over the rows of requests marked with
    ``FLOOR_MARKER``, its calls timed into ``FLOOR_TIMES_ENV``'s counters (V1 runner only)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        path = os.environ.get(FLOOR_TIMES_ENV)
        self._times = CallTimes(path) if path else None
        self._rows: set[int] = set()
        self._index: torch.Tensor | None = None  # the marked rows, when they are not the whole batch
        self._whole = 0  # the batch size when the marked rows are exactly 0..size-1, else 0
        self._device = device

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        start = time.perf_counter_ns()
        try:
            if batch_update:
                self._update(batch_update)
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start)

    def _update(self, batch_update: BatchUpdate) -> None:
        # the order vLLM's BatchUpdate documents (vllm 0.32.0, v1/sample/logits_processor/interface.py): removed, added, moved
        rows = self._rows
        rows.difference_update(batch_update.removed)
        for index, params, _, _ in batch_update.added:
            if FLOOR_MARKER in (getattr(params, "extra_args", None) or {}):
                rows.add(index)
            else:
                rows.discard(index)
        for a, b, direction in batch_update.moved:
            a_in, b_in = a in rows, b in rows
            rows.discard(a)
            rows.discard(b)
            if a_in:
                rows.add(b)
            if b_in and direction == MoveDirectionality.SWAP:
                rows.add(a)
        size = len(rows)
        self._whole = size if size and max(rows) == size - 1 and size == batch_update.batch_size else 0
        self._index = torch.tensor(sorted(rows), dtype=torch.int64, device=self._device) if rows else None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter_ns()
        try:
            if self._whole and logits.shape[0] == self._whole:
                logits.fill_(-math.inf)  # the micro floor's work, exactly
            elif self._index is not None:
                logits.index_fill_(0, self._index, -math.inf)
            return logits
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start, apply=True)
