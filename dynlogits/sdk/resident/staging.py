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


class SlotFlags:
    """``dev[slot]``: an int64 per slot the device writes (``fill`` until it does); the host reads a
    recent copy.

    ``reset(slot, owner)`` (a new occupant) sets the slot back to ``fill`` and bumps its epoch; when
    the departing ``owner`` may have a value on its way, that value is first moved, on the device,
    to a *grave* owned by it, so a request that ends (its stop token sampled, say) before its flag
    was read is still reported. ``snapshot()`` queues one copy of slots and graves to the host with
    the epochs and grave owners of that moment (skipped while the last copy is still in flight: the
    values are sticky, nothing is lost); ``read()`` returns ``(values, epochs, departed)`` of the
    last copy that landed (``departed``: each grave owner whose value was set, with that value), or
    ``None`` until one has, so a value written for a slot's previous occupant is told apart by its
    epoch. ``values`` is valid until the next ``snapshot`` (its pinned buffer is reused). On the
    CPU a value is read in the step that writes it: no graves are needed.
    """

    def __init__(self, num_slots: int, device: torch.device, *, fill: int = -1) -> None:
        self.num_slots = num_slots
        self.fill = fill
        self.device = device
        self.epochs = np.zeros(num_slots, dtype=np.int64)
        self._cuda = on_accelerator(device)
        self.asynchronous = self._cuda  # whether a snapshot lands later than it is queued
        self._graves: list[Any] = []  # grave -> its owner (None: free); grave g is dev[num_slots + g]
        self.dev = torch.full((num_slots,), fill, dtype=torch.int64, device=device)
        self._landing: tuple[Any, torch.Tensor, np.ndarray, list[Any]] | None = None  # event, host copy, epochs, owners
        self._landed: tuple[np.ndarray, np.ndarray, list[tuple[Any, int]]] | None = None
        self._read_from: torch.Tensor | None = None  # the host copy ``_landed`` views
        self._spare: torch.Tensor | None = None  # a read host copy, for the next snapshot
        if not self._cuda:
            self._host_np = self.dev.numpy()

    def reset(self, slot: int, owner: Any = None) -> bool:
        """A new occupant for ``slot``; whether ``owner``'s value (if any) went to a grave."""
        graved = False
        if self._cuda and owner is not None:
            grave = self._free_grave()
            self._graves[grave] = owner
            at = self.num_slots + grave
            self.dev[at : at + 1].copy_(self.dev[slot : slot + 1], non_blocking=True)
            graved = True
        self.dev[slot : slot + 1].fill_(self.fill)  # not ``dev[slot] = fill``: a blocking copy on CUDA
        self.epochs[slot] += 1
        return graved

    def _free_grave(self) -> int:
        for g, owner in enumerate(self._graves):
            if owner is None:
                return g
        grown = max(8, len(self._graves))  # double the graves (a device-side copy of the old values)
        dev = torch.full((self.dev.shape[0] + grown,), self.fill, dtype=torch.int64, device=self.device)
        dev[: self.dev.shape[0]].copy_(self.dev, non_blocking=True)
        self.dev = dev
        self._graves += [None] * grown
        return len(self._graves) - grown

    def snapshot(self) -> bool:
        """Queue a copy of the current values to the host; ``False`` when the last one is still in
        flight (try again next step: the values are sticky)."""
        if not self._cuda:
            return True
        if self._landing is not None and not self._landing[0].query():
            return False
        self._take_landed()
        host, self._spare = self._spare, None
        if host is None or host.shape != self.dev.shape or self._landed is not None:
            host = pinned(tuple(self.dev.shape), torch.int64, self.device)
        host.copy_(self.dev, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._landing = (event, host, self.epochs.copy(), list(self._graves))
        return True

    def _take_landed(self) -> None:
        if self._landing is None or not self._landing[0].query():
            return
        _, host, epochs, owners = self._landing
        self._landing = None
        values = host.numpy()
        self._read_from = host
        departed = []
        for g, owner in enumerate(owners):
            if owner is not None:
                value = int(values[self.num_slots + g])
                if value != self.fill:
                    departed.append((owner, value))
                if self._graves[g] is owner:  # read: the grave is free again
                    self._graves[g] = None
        if self._landed is not None:  # an earlier landing not read yet: keep its departed owners
            departed = self._landed[2] + departed
        self._landed = (values[: self.num_slots], epochs, departed)

    def read(self) -> tuple[np.ndarray, np.ndarray, list[tuple[Any, int]]] | None:
        if not self._cuda:
            return self._host_np, self.epochs, []
        self._take_landed()
        landed, self._landed = self._landed, None
        if landed is not None:  # its buffer is reused by the next snapshot, once the caller is done
            self._spare = self._read_from
        return landed
