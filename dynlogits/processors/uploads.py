"""Host values to a device tensor without blocking: the resident and hosted apply paths' uploads.

``StepUpload``: a ring of pinned host buffers copied non-blocking, never overwritten while a copy
is queued. ``StepValues``: values rewritten every step into one device tensor kept while a layout
stays. ``to_device(values, dtype, device)``: ``torch.tensor(values, dtype=dtype, device=device)``
without the blocking pageable copy (a fresh device tensor; plain ``torch.tensor`` on the CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["StepUpload", "StepValues", "on_accelerator", "pinned", "to_device"]


def on_accelerator(device: torch.device) -> bool:
    """Whether ``device`` is an accelerator's (host and device memory differ): anything but the CPU."""
    return device.type != "cpu"


def pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed host tensor, pinned when ``device`` is an accelerator (copies from it need not block)."""
    return torch.zeros(shape, dtype=dtype, pin_memory=on_accelerator(device))


class StepUpload:
    """Per-step host values -> a fresh device tensor, through a ring of pinned host buffers.

    ``buffer(n)`` gives a host array to fill, ``upload(n)`` a new device tensor of its first ``n``
    values (uploads never alias). A host buffer is reused only once its copy has run: the ring
    (``RING``) grows while the next buffer is in flight, waiting only past ``MAX_RING``."""

    RING = 8
    MAX_RING = 4096  # buffers the ring may grow to while the device lags, before waiting for it
    MAX_VIEWS = 256  # CPU: views of the buffer kept, one per count uploaded

    def __init__(self, dtype: torch.dtype, device: torch.device, capacity: int = 256, *, ring: int | None = None) -> None:
        self.dtype = dtype
        self.device = device
        self.ring = ring or self.RING
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        """Buffers of ``capacity`` values, as many as the ring has grown to. The old buffers may still
        be in flight: the caching host allocator keeps a pinned block until its copies have run."""
        self.capacity = capacity
        ring = max(self.ring, len(getattr(self, "_host", ()))) if on_accelerator(self.device) else 1
        self._host = [pinned((capacity,), self.dtype, self.device) for _ in range(ring)]
        self._np = [h.numpy() for h in self._host]
        self._events: list[Any] = [None] * ring
        self._next = 0
        self._views: dict[int, torch.Tensor] = {}  # CPU: the buffer's first n values, per n

    def buffer(self, n: int) -> np.ndarray:
        """A host buffer of ``n`` values to fill, then pass to ``upload``."""
        if n > self.capacity:
            self._alloc(max(n, 2 * self.capacity))
        i = self._next
        event = self._events[i]
        if event is not None and not event.query():  # the device is a whole ring behind
            if len(self._host) < self.MAX_RING:  # add a buffer rather than wait
                self._host.insert(i, pinned((self.capacity,), self.dtype, self.device))
                self._np.insert(i, self._host[i].numpy())
                self._events.insert(i, None)
            else:
                event.synchronize()  # thousands of uploads behind: wait
        return self._np[i][:n]

    def upload(self, n: int, *, keep: bool = False) -> torch.Tensor:
        """The first ``n`` values of the last ``buffer``, as a device tensor valid until the next
        ``buffer`` call (an upload is consumed within its step), or for as long as it is referenced
        with ``keep`` (a layout reused over many steps). On CPU it is the buffer itself (a copy
        with ``keep``)."""
        if not on_accelerator(self.device):
            if keep:
                return self._host[0][:n].clone()
            view = self._views.get(n)
            if view is None:  # one view per count: a step's upload makes no tensor (no torch call)
                if len(self._views) >= self.MAX_VIEWS:
                    self._views.clear()
                view = self._views[n] = self._host[0][:n]
            return view
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        self.upload_into(out)
        return out

    def upload_into(self, out: torch.Tensor) -> None:
        """Accelerator only: the first ``len(out)`` values of the last ``buffer`` into the device
        tensor ``out``, without blocking. Stream order makes reusing ``out`` safe: the copy runs
        after every kernel queued before it, reads of the last values included."""
        i = self._next
        out.copy_(self._host[i][: out.shape[0]], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[i] = event
        self._next = (i + 1) % len(self._host)


class StepValues:
    """Values the host rewrites every step (``host()``, then ``push()``) into one device tensor
    (``resize``'s) while their number stays, so views of it are taken once. ``push`` is a
    non-blocking copy from a pinned ring (``StepUpload``); on the CPU the host buffer is the tensor.
    Storage grows by doubling."""

    def __init__(self, dtype: torch.dtype, device: torch.device, capacity: int = 256) -> None:
        self.dtype = dtype
        self.device = device
        self._ring = StepUpload(dtype, device, capacity) if on_accelerator(device) else None
        self._alloc(capacity)
        self.resize(0)

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        if self._ring is not None:
            self._storage = torch.empty(capacity, dtype=self.dtype, device=self.device)
        else:
            self._storage = torch.zeros(capacity, dtype=self.dtype)
            self._np = self._storage.numpy()

    def resize(self, n: int) -> torch.Tensor:
        """Hold ``n`` values from now on; returns the device tensor they land in (a new one after
        each call: take views of it, not of an earlier one)."""
        if n > self.capacity:
            self._alloc(max(n, 2 * self.capacity))
        self.n = n
        self.dev = self._storage[:n]
        return self.dev

    def host(self) -> np.ndarray:
        """The host array to write this step's ``n`` values into (all of them)."""
        return self._np[: self.n] if self._ring is None else self._ring.buffer(self.n)

    def push(self) -> None:
        """Queue this step's values to the device tensor (nothing to do on the CPU)."""
        if self._ring is not None:
            self._ring.upload_into(self.dev)


_RINGS: dict[tuple[torch.device, torch.dtype], Any] = {}  # StepUpload rings, 64 deep (about ten uploads a step)


def to_device(values: Sequence[float] | Sequence[int] | np.ndarray, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """``values`` (a sequence or a 1-D array) as a new 1-D tensor on ``device`` (see the module doc)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype, device=device)
    if dtype == torch.bfloat16:  # numpy has no bfloat16: stage as float32, convert on the device
        return to_device(values, torch.float32, device).to(dtype)
    key = (device, dtype)
    ring = _RINGS.get(key)
    if ring is None:
        ring = _RINGS[key] = StepUpload(dtype, device, ring=64)
    n = len(values)
    ring.buffer(n)[:] = values
    return ring.upload(n)
