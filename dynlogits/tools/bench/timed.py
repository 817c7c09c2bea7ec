"""The vLLM adapter with the time of its engine-facing calls counted, for the ``engine`` suite.

``TimedVllmLogitsProcessor`` is ``DynamoVllmLogitsProcessor`` whose ``update_state`` and
``apply`` add their wall time (ns) and a call count to ``CallTimes``: two int64 counters in a file
named by ``CALL_TIMES_ENV``, mapped shared, so the process that drives ``vllm.LLM`` reads what
the engine core's process spent inside the adapter without an RPC. The cost it adds per call is
two ``perf_counter_ns`` and one 16-byte write. Load it as ``engine.TIMED_FQCN``; with the
variable unset it counts nothing."""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

__all__ = ["CALL_TIMES_ENV", "CallTimes", "TimedVllmLogitsProcessor"]

#: The file the counters live in (created by the reader before the engine starts).
CALL_TIMES_ENV = "DYNLOGITS_BENCH_CALL_TIMES"

_LAYOUT = struct.Struct("<qq")  # ns spent in the calls, number of calls


class CallTimes:
    """Two cumulative counters (ns, calls) shared between processes through one mapped file."""

    __slots__ = ("_map",)

    def __init__(self, path: str | Path, *, create: bool = False) -> None:
        if create:
            Path(path).write_bytes(bytes(_LAYOUT.size))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), _LAYOUT.size)

    def add(self, ns: int) -> None:
        spent, calls = _LAYOUT.unpack_from(self._map)
        _LAYOUT.pack_into(self._map, 0, spent + ns, calls + 1)

    def read(self) -> tuple[int, int]:
        """(ns spent in the calls, number of calls) so far."""
        spent, calls = _LAYOUT.unpack_from(self._map)
        return int(spent), int(calls)


class TimedVllmLogitsProcessor(DynamoVllmLogitsProcessor):
    """``DynamoVllmLogitsProcessor`` counting the wall time of ``update_state`` and ``apply``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(CALL_TIMES_ENV)
        self._times = CallTimes(path) if path else None

    def update_state(self, batch_update: Any) -> None:
        start = time.perf_counter_ns()
        try:
            super().update_state(batch_update)
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start)

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        start = time.perf_counter_ns()
        try:
            return super().apply(logits, ctx)
        finally:
            if self._times is not None:
                self._times.add(time.perf_counter_ns() - start)
