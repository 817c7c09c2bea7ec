"""Host <-> device traffic of the resident apply path, none of it blocking.

Three shapes of traffic, each with one class:

* ``SlotTable``: per-slot data (a request's ids, values, forced sequence) written on the host when
  a request enters a slot and copied to the device once, at ``flush`` (a batch change), row by
  dirty row, with non-blocking copies from pinned memory.
* ``dynlogits.uploads.StepUpload`` / ``StepValues`` (shared with the hosted path): small per-step
  arrays the host knows and the device needs (the V1 runner's positions and planned forced ids,
  host-decided tokens), written into one of a ring of pinned buffers and copied non-blocking
  (``StepValues``: always into the same device tensor while the layout stays).
* ``SlotFlags``: a small per-slot int64 tensor the device writes (the position at which a slot's
  row was left with no token) and the host reads back through pinned buffers and events
  (``FlagSnapshot``), answering "not yet" instead of waiting.

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

__all__ = ["FlagSnapshot", "SlotFlags", "SlotTable"]


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
        self._own_mirror()
        if n > self.width:
            self._alloc(max(n, 2 * self.width))
        row = self.host_np[slot]
        row[:n] = values
        row[n:] = (row[n - 1] if n else 0) if self.pad is None else self.pad
        self._dirty.add(slot)

    def _own_mirror(self) -> None:
        """Make the mirror writable without waiting: while the last flush's copies still read it
        (a batch change, or a failure noted, before the device ran them), write to a fresh pinned
        copy instead; the caching host allocator keeps the old one until those copies have run."""
        if self._event is not None and not self._event.query():
            old = self.host
            assert old is not None
            host = pinned(tuple(old.shape), self.dtype, self.device)
            host.copy_(old)
            self.host, self.host_np = host, host.numpy()
        self._event = None

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


class FlagSnapshot:
    """One copy of a ``SlotFlags``' values on its way to the host, with each slot's owner at the
    moment it was queued (a value is attributed to the request that held the slot then, so a
    request that left before the copy landed is still found). ``values`` is valid once
    ``landed()``, until ``release()`` hands the buffer back for reuse."""

    __slots__ = ("_buffer", "_event", "_pool", "owners", "values")

    def __init__(self, event: Any, buffer: tuple[torch.Tensor, np.ndarray], owners: list[Any],
                 pool: list[tuple[torch.Tensor, np.ndarray]] | None) -> None:
        self._event, self._buffer, self.owners, self._pool = event, buffer, owners, pool
        self.values = buffer[1]

    def landed(self) -> bool:
        return self._event is None or self._event.query()

    def release(self) -> None:
        if self._pool is not None:
            self._pool.append(self._buffer)
            self._pool = None


class SlotFlags:
    """``dev[slot]``: an int64 per slot the device writes (``fill`` until it does); the host reads
    copies of it.

    ``reset(slot, owner)`` gives ``slot`` a new occupant and sets it back to ``fill`` (on the device,
    in stream order: a copy queued before the reset still sees the former occupant's value).
    ``snapshot()`` queues one copy of every slot with the owners of that moment, into a pinned
    buffer of its own (a pool: a copy in flight is never overwritten), so a value written in a step
    is covered by the copy queued at the end of that same step. On the CPU the snapshot is the
    values themselves, read at once.
    """

    def __init__(self, num_slots: int, device: torch.device, *, fill: int = -1) -> None:
        self.num_slots = num_slots
        self.fill = fill
        self.device = device
        self.asynchronous = on_accelerator(device)  # whether a snapshot lands later than it is queued
        self.dev = torch.full((num_slots,), fill, dtype=torch.int64, device=device)
        self.owners: list[Any] = [None] * num_slots
        #: pinned host buffers (and their numpy views) no copy is in flight to
        self._pool: list[tuple[torch.Tensor, np.ndarray]] = []
        self._live = None if self.asynchronous else (self.dev, self.dev.numpy())

    def reset(self, slot: int, owner: Any = None) -> None:
        """A new occupant (``owner``, or ``None`` for an empty slot) for ``slot``."""
        self.dev[slot : slot + 1].fill_(self.fill)  # not ``dev[slot] = fill``: a blocking copy on CUDA
        self.owners[slot] = owner

    def snapshot(self) -> FlagSnapshot:
        """A copy of the current values on its way to the host (never waits)."""
        if self._live is not None:
            return FlagSnapshot(None, self._live, list(self.owners), None)
        if self._pool:
            buffer = self._pool.pop()
        else:
            host = pinned((self.num_slots,), torch.int64, self.device)
            buffer = (host, host.numpy())
        buffer[0].copy_(self.dev, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return FlagSnapshot(event, buffer, list(self.owners), self._pool)
