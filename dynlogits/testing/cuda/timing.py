"""What the GPU checks measure of a call on CUDA: the device ops it queues (``torch.profiler``),
whether it synchronizes (``sync_error``) and its time (host wall to a final synchronize, device
between CUDA events). Shared by ``check`` and
the kinds' kernel checks; CUDA only, never run by the test suite."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["device_ops", "sync_error", "timed"]


def device_ops(fn: Callable[[], object], steps: int, trace_dir: Path | None = None) -> tuple[float, list[str]]:
    """Device ops (kernels, copies, memsets) per call of ``fn`` over ``steps`` calls, and the names
    of one call's (the trace goes to ``trace_dir``, else a temporary folder)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = (trace_dir or Path(tmp)) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return len(device) / steps, [e.get("name", "")[:90] for e in device[: len(device) // steps]]


def timed(fn: Callable[[], object], steps: int, warmup: int = 3) -> tuple[float, float]:
    """Per call of ``fn`` after ``warmup`` calls: host wall ms to a final synchronize, device ms
    between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps, float(start.elapsed_time(end)) / steps


def sync_error(*calls: Callable[[], object]) -> str:
    """The first line of what ``calls`` (in order) raise under ``torch.cuda.set_sync_debug_mode("error")``
    (``""``: none synchronized)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:200]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return ""
