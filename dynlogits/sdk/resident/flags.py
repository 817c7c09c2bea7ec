"""The resident path's failure flags: a small per-slot int64 tensor the device writes (the position
at which a slot's row was left with no token) and the host reads back through pinned buffers and
events (``FlagSnapshot``), answering "not yet" instead of waiting. A group that settles its own rows
reports them as per-row flags instead (``SlotFlags.snapshot(rows, positions)``): a tensor it computes
anyway, copied back as it is, so no write into the per-slot flags. On the CPU there is no device to
wait for: the snapshot is the values themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dynlogits.processors.uploads import on_accelerator, pinned

__all__ = ["FlagSnapshot", "SlotFlags"]


class FlagSnapshot:
    """One copy of a ``SlotFlags``' values on its way to the host, with each slot's owner at the
    moment it was queued (a value is attributed to the request that held the slot then, so a
    request that left before the copy landed is still found). ``values`` is valid once
    ``landed()``, until ``release()`` hands the buffer back for reuse."""

    __slots__ = ("_buffer", "_event", "_pool", "owners", "positions", "values")

    def __init__(self, event: Any, buffer: tuple[torch.Tensor, np.ndarray], owners: list[Any],
                 pool: list[tuple[torch.Tensor, np.ndarray]] | None, positions: np.ndarray | None = None) -> None:
        self._event, self._buffer, self.owners, self._pool = event, buffer, owners, pool
        self.values = buffer[1]
        #: per-row flags (``SlotFlags.snapshot(rows, ...)``) whose positions the host knew: one per row
        self.positions = positions

    @property
    def per_row(self) -> bool:
        """Whether ``values`` are per-row flags (a slot per row, then, unless ``positions`` holds
        them, a position per row) rather than one position per slot."""
        return self.values.ndim == 2 or self.positions is not None

    def landed(self) -> bool:
        return self._event is None or self._event.query()

    def release(self) -> None:
        if self._pool is not None:
            self._pool.append(self._buffer)
            self._pool = None


class SlotFlags:
    """``dev[slot]``: an int64 per slot the device writes (``fill`` until it does); the host reads copies.

    ``reset(slot, owner)`` gives ``slot`` a new occupant and refills it in stream order (a copy
    queued before still sees the former occupant's value). ``snapshot()`` queues one copy of every
    slot with that moment's owners into a pinned buffer of its own (a copy in flight is never
    overwritten); ``snapshot(rows, positions)`` one copy of per-row flags instead. On the CPU the
    snapshot is the values themselves."""

    def __init__(self, num_slots: int, device: torch.device, *, fill: int = -1) -> None:
        self.num_slots = num_slots
        self.fill = fill
        self.device = device
        self.asynchronous = on_accelerator(device)  # whether a snapshot lands later than it is queued
        self.dev = torch.full((num_slots,), fill, dtype=torch.int64, device=device)
        self.owners: list[Any] = [None] * num_slots
        #: pinned host buffers (and their numpy views) no copy is in flight to
        self._pool: list[tuple[torch.Tensor, np.ndarray]] = []
        #: the same for per-row snapshots, by shape
        self._row_pools: dict[tuple[int, ...], list[tuple[torch.Tensor, np.ndarray]]] = {}
        self._live = None if self.asynchronous else (self.dev, self.dev.numpy())

    def reset(self, slot: int, owner: Any = None) -> None:
        """A new occupant (``owner``, or ``None`` for an empty slot) for ``slot``."""
        self.dev[slot : slot + 1].fill_(self.fill)  # not ``dev[slot] = fill``: a blocking copy on CUDA
        self.owners[slot] = owner

    def snapshot(self, rows: torch.Tensor | None = None, positions: np.ndarray | None = None) -> FlagSnapshot:
        """A copy of the current values on its way to the host (never waits); with ``rows``, of
        these per-row flags instead (int64 on the device, contiguous: each row's slot, the last slot
        for "no flag", ``[n]`` with the host's ``positions`` (copied), or ``[2, n]`` with the
        positions as its second row)."""
        owners = list(self.owners)
        if rows is None and self._live is not None:
            return FlagSnapshot(None, self._live, owners, None)
        source = self.dev if rows is None else rows
        pool = self._pool if rows is None else self._row_pools.setdefault(tuple(rows.shape), [])
        if pool:
            buffer = pool.pop()
        else:
            host = pinned(tuple(source.shape), torch.int64, self.device)
            buffer = (host, host.numpy())
        buffer[0].copy_(source, non_blocking=self.asynchronous)  # on the CPU: a copy, so no numpy view per step
        event = None
        if self.asynchronous:
            event = torch.cuda.Event()
            event.record()
        return FlagSnapshot(event, buffer, owners, pool, None if positions is None else np.array(positions, dtype=np.int64))
