"""Host <-> device traffic of the resident apply path, none of it blocking.

Three shapes of traffic, each with one class:

* ``SlotTable``: per-slot data (a request's ids, values, forced sequence) written on the host when
  a request enters a slot and copied to the device once, at ``flush`` (a batch change), row by
  dirty row, with non-blocking copies from pinned memory.
* ``StepUpload``: small per-step arrays the host knows and the device needs (the V1 runner's
  positions, host-decided tokens): written into one of a ring of pinned buffers and copied
  non-blocking, so the next step never overwrites a buffer whose copy is still queued.
* ``SlotFlags``: a small per-slot int64 tensor the device writes (the position at which a slot's
  row was left with no token) and the host reads back through a pinned buffer and an event,
  answering "not yet" instead of waiting.

On the CPU there is no device to wait for: host and device views share memory, copies are no-ops
and reads are immediate. Nothing here calls ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()`` or
``torch.tensor(list)`` after construction (the no-sync test counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["SlotFlags", "SlotTable", "StepUpload", "on_accelerator"]


def on_accelerator(device: torch.device) -> bool:
    """Whether ``device`` is an accelerator's (host and device memory differ): anything but the CPU."""
    return device.type != "cpu"


def _pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, pin_memory=on_accelerator(device))


class SlotTable:
    """A ``[num_slots, width]`` device table with a host mirror; rows grow to the widest value set.

    ``set(slot, values)`` writes a row on the host, padded with ``pad`` or, when ``pad`` is
    ``None``, by repeating the row's last value (so a padded id row names no other id; an empty row
    is all zeros); ``flush()`` copies the rows set since the last flush to the device. ``dev`` is
    the device table (valid after ``flush``; a wider table is a new tensor: read ``dev`` after each
    flush).
    """

    def __init__(self, num_slots: int, dtype: torch.dtype, device: torch.device, *, width: int = 1,
                 pad: float | None = None) -> None:
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.pad = pad
        self._dirty: set[int] = set()
        self._event: Any = None  # torch.cuda.Event of the last queued copies
        self._whole = False  # the device table is new (wider): copy the whole mirror at flush
        self.host: torch.Tensor | None = None
        self._alloc(width)

    def _alloc(self, width: int) -> None:
        host = _pinned((self.num_slots, width), self.dtype, self.device)
        old = self.host
        if old is not None:
            host[:, : old.shape[1]] = old
            host[:, old.shape[1] :] = old[:, -1:] if self.pad is None else self.pad
        elif self.pad is not None:
            host.fill_(self.pad)
        self.host = host
        self.host_np = host.numpy()
        self.width = width
        if on_accelerator(self.device):  # the whole mirror goes at the next flush, without blocking
            self.dev = torch.empty(host.shape, dtype=self.dtype, device=self.device)
            self._whole = True
        else:
            self.dev = host

    def set(self, slot: int, values: Sequence[float] | np.ndarray) -> None:
        n = len(values)
        self._wait_for_copies()
        if n > self.width:
            self._alloc(max(n, 2 * self.width))
        row = self.host_np[slot]
        row[:n] = values
        row[n:] = (row[n - 1] if n else 0) if self.pad is None else self.pad
        self._dirty.add(slot)

    def _wait_for_copies(self) -> None:
        if self._event is not None and not self._event.query():
            self._event.synchronize()  # a batch change while the last one's copies are still queued: rare

    def flush(self) -> bool:
        """Copy the rows set since the last flush to the device; whether there were any."""
        if not self._dirty and not self._whole:
            return False
        if on_accelerator(self.device):
            if self._whole:
                self.dev.copy_(self.host, non_blocking=True)  # type: ignore[arg-type]
            else:
                for slot in sorted(self._dirty):
                    self.dev[slot].copy_(self.host[slot], non_blocking=True)  # type: ignore[index]
            self._record()
        self._dirty.clear()
        self._whole = False
        return True

    def _record(self) -> None:
        self._event = torch.cuda.Event()
        self._event.record()


class StepUpload:
    """Per-step host values -> a fresh device tensor, through a ring of pinned host buffers.

    ``buffer(n)`` gives a host array to fill, ``upload(n)`` the device copy of its first ``n``
    values: a new tensor each time, so several uploads of one step never alias. The host buffer is
    reused only once its copy has run: a ring of ``RING`` that grows by a buffer whenever the next
    one is still in flight (waiting only past ``MAX_RING``).
    """

    RING = 8
    MAX_RING = 4096  # buffers the ring may grow to while the device lags, before waiting for it

    def __init__(self, dtype: torch.dtype, device: torch.device, capacity: int = 256, *, ring: int | None = None) -> None:
        self.dtype = dtype
        self.device = device
        self.ring = ring or self.RING
        self._next = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        ring = self.ring if on_accelerator(self.device) else 1
        self._host = [_pinned((capacity,), self.dtype, self.device) for _ in range(ring)]
        self._np = [h.numpy() for h in self._host]
        self._events: list[Any] = [None] * ring

    def buffer(self, n: int) -> np.ndarray:
        """A host buffer of ``n`` values to fill, then pass to ``upload``."""
        if n > self.capacity:
            self._alloc(max(n, 2 * self.capacity))
        i = self._next
        event = self._events[i]
        if event is not None and not event.query():  # the device is a whole ring behind
            if len(self._host) < self.MAX_RING:  # add a buffer rather than wait
                self._host.insert(i, _pinned((self.capacity,), self.dtype, self.device))
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
        i = self._next
        if not on_accelerator(self.device):
            return self._host[i][:n].clone() if keep else self._host[i][:n]
        out = torch.empty(n, dtype=self.dtype, device=self.device)
        out.copy_(self._host[i][:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[i] = event
        self._next = (i + 1) % len(self._host)
        return out


class SlotFlags:
    """``dev[slot]``: an int64 per slot the device writes (``fill`` until it does); the host reads a
    recent copy.

    ``reset(slot)`` (a new occupant) sets the slot back to ``fill`` and bumps its epoch;
    ``snapshot()`` queues a copy to the host together with the epochs of that moment (skipped
    while the last copy is still in flight: the values are sticky, nothing is lost); ``read()``
    returns ``(values, epochs)`` of the last copy that landed, or ``None`` until one has, so a
    value written for a slot's previous occupant is told apart by its epoch.
    """

    def __init__(self, num_slots: int, device: torch.device, *, fill: int = -1) -> None:
        self.fill = fill
        self.dev = torch.full((num_slots,), fill, dtype=torch.int64, device=device)
        self.epochs = np.zeros(num_slots, dtype=np.int64)
        self._cuda = on_accelerator(device)
        self.asynchronous = self._cuda  # whether a snapshot lands later than it is queued
        if self._cuda:
            self._host = _pinned((num_slots,), torch.int64, device)
            self._host.fill_(fill)
            self._host_np = self._host.numpy()
            self._event: torch.cuda.Event | None = None
            self._snap_epochs = self.epochs.copy()
        else:
            self._host_np = self.dev.numpy()

    def reset(self, slot: int) -> None:
        self.dev[slot] = self.fill
        self.epochs[slot] += 1

    def snapshot(self) -> bool:
        """Queue a copy of the current values to the host; ``False`` when the last one is still in
        flight (try again next step: the values are sticky)."""
        if not self._cuda:
            return True
        if self._event is not None and not self._event.query():
            return False
        self._host.copy_(self.dev, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        self._snap_epochs = self.epochs.copy()
        return True

    def read(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self._cuda:
            return self._host_np, self.epochs
        if self._event is None or not self._event.query():
            return None
        return self._host_np, self._snap_epochs
