"""Host <-> device traffic of the resident apply path, none of it blocking.

Three shapes of traffic, each with one class:

* ``SlotTable``: per-slot data (a request's ids, values, forced sequence) written on the host when
  a request enters a slot and copied to the device once, at ``flush`` (a batch change), row by
  dirty row, with non-blocking copies from pinned memory.
* ``dynlogits.uploads.StepUpload`` (shared with the hosted path): small per-step arrays the host
  knows and the device needs (the V1 runner's positions, host-decided tokens), written into one of
  a ring of pinned buffers and copied non-blocking.
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

from dynlogits.uploads import on_accelerator, pinned

__all__ = ["SlotFlags", "SlotTable"]


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
        host = pinned((self.num_slots, width), self.dtype, self.device)
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
            self._host = pinned((num_slots,), torch.int64, device)
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
