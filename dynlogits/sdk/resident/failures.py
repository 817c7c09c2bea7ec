"""The resident path's failure state: which slots' requests failed, the per-slot flags the device
writes when a row is left with no token, and their read back.

A failed slot's rows are fail-stopped every step (``failed``, ``failed_member``). A row a group
left with no token is fail-stopped on the device in the same step and its slot flagged with the
row's output position (``record_dead``: one fused op per group, ``dynlogits.kernels.dead_rows``,
where it runs on the device, else its eager ops), or, for a group that settles its own rows,
flagged per row (``flag_rows``: a tensor the group computes anyway, no write into the flags); the
flags go to the host in a copy queued in that step (``queue_read_back``, ``flag_rows``) and, once
it lands (``dynlogits.sdk.readback``, any thread), the request that held the slot when the copy
was queued is failed and queued in ``newly_failed`` for the slot engine to fail-stop wherever it
is now. Nothing here waits on the device."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dynlogits.kernels import dead_rows as dead_rows_kernels
from dynlogits.kernels.dead_rows import GATE, dead_rows_, flag_reference, record_reference
from dynlogits.processors.slots import Dead, SlotTable, StepInputs

from ..guard import NO_TOKEN_LEFT, GuardedRequest
from ..readback import INBOX
from .flags import FlagSnapshot, SlotFlags

__all__ = ["Failures"]


class Failures:
    """Failure state of a ``SlotBatch`` of ``num_slots`` slots (tables hold one more row: the
    sentinel, which is never failed nor flagged)."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.num_slots = num_slots
        self.device = device
        self.failed: set[int] = set()  # slots whose request failed: fail-stopped every step
        self.failed_member = SlotTable(num_slots + 1, torch.bool, device, pad=0)
        self.flags = SlotFlags(num_slots + 1, device)  # output position a slot's row was left empty, or -1
        self._no_flags = np.full(num_slots, self.flags.fill, dtype=np.int64).tobytes()  # none flagged, as bytes
        self._minus_one = torch.full((), -1, dtype=torch.long, device=device)
        self._written = False  # flags written since the last snapshot was queued
        self._no_row_flags: dict[int, bytes] = {}  # n rows none flagged (every slot the sentinel), as bytes
        self._cpu_rows: dict[tuple[int, ...], tuple[torch.Tensor, np.ndarray]] = {}  # ``flag_rows``' CPU buffers
        #: requests a landed snapshot failed (possibly on the watcher thread), to be fail-stopped in
        #: their current slot by the slot engine
        self.newly_failed: deque[GuardedRequest] = deque()
        GATE.ready(device)  # the fused epilogue's probe (one sync on CUDA) now, not in a step

    def set_failed(self, slot: int, failed: bool) -> bool:
        """Mark ``slot`` failed (or not); returns whether that changed (its table row is then staged)."""
        if failed == (slot in self.failed):
            return False
        if failed:
            self.failed.add(slot)
        else:
            self.failed.discard(slot)
        self.failed_member.set(slot, [int(failed)])
        return True

    def record_dead(self, step: StepInputs, deaths: list[Dead], real_rows: torch.Tensor | None) -> None:
        """Fail-stop the rows left with no token (after every group, as the host path does) and flag
        their slots; rows after drafts (``real_rows`` false) only stop: the draft may be rejected."""
        for d in deaths:
            if d.flagged:
                continue  # settled and flagged by its group (``flag_rows``)
            if d.settled is not None:  # fail-stopped by its group already: only the flags
                flag_reference(self.flags.dev, d.slots, d.settled, d.rows, d.positions, real_rows, self._minus_one)
            else:
                self._settle(step, d, real_rows)
            self._written = True

    def _settle(self, step: StepInputs, d: Dead, real_rows: torch.Tensor | None) -> None:
        """``d``'s rows tested, the dead ones fail-stopped and their slots flagged: one fused op
        (``dynlogits.kernels.dead_rows``) where it runs on this device, else its eager ops."""
        assert d.witness is not None
        args = (step.logits, d.witness, d.rows, d.slots, d.positions, d.stop_index, d.can_stop,
                None if d.rows is not None else step.stops, d.where, real_rows, self.flags.dev)
        _gated(self.device, args, lambda: record_reference(*args, self._minus_one))

    def flag_rows(self, rows: torch.Tensor, positions: np.ndarray | None = None) -> None:
        """Per-row flags from a group that settled its rows (``StepInputs.flag_rows``): ``rows`` holds
        each row's slot, the sentinel (``num_slots``) where the row is not flagged, then, without
        ``positions`` (the host's, one per row), a second row of positions (``SlotFlags.snapshot``).
        Their copy is queued now, in the step that wrote them; ``read`` runs when it lands (on the
        CPU at once, as ``INBOX.when_landed`` would, without a snapshot)."""
        if self.flags.asynchronous:
            snapshot = self.flags.snapshot(rows, positions)
            INBOX.when_landed(snapshot.landed, lambda: self.read(snapshot), self.device)
            return
        shape = tuple(rows.shape)
        buffer = self._cpu_rows.get(shape)
        if buffer is None:
            if len(self._cpu_rows) >= 16:  # one per layout size seen lately
                self._cpu_rows.clear()
            host = torch.empty(shape, dtype=torch.int64)
            buffer = self._cpu_rows[shape] = (host, host.numpy())
        buffer[0].copy_(rows)  # a copy into a kept buffer: no numpy view made per step
        self._read_rows(buffer[1], positions, self.flags.owners)

    def queue_read_back(self) -> None:
        """If flags were written since the last copy, queue one now, in the step that wrote them
        (never waits); ``read`` runs when it lands."""
        if self._written:
            self._written = False
            snapshot = self.flags.snapshot()
            INBOX.when_landed(snapshot.landed, lambda: self.read(snapshot), self.device)

    def read(self, snapshot: FlagSnapshot) -> None:
        """Fail the requests a landed snapshot flags (any thread: see ``dynlogits.sdk.readback``) and
        queue them in ``newly_failed``."""
        try:
            if snapshot.per_row:
                self._read_rows(snapshot.values, snapshot.positions, snapshot.owners)
                return
            values = snapshot.values[: self.num_slots]  # not the sentinel's
            if values.tobytes() == self._no_flags:  # nothing flagged (a byte compare: cheaper than numpy)
                return
            for slot in np.flatnonzero(values >= 0).tolist():
                self._fail(snapshot.owners[slot], int(values[slot]))
        finally:
            snapshot.release()

    def _read_rows(self, values: np.ndarray, positions: np.ndarray | None, owners: list[GuardedRequest | None]) -> None:
        """``read`` for per-row flags (``flag_rows``): ``values`` each row's slot, then, without
        ``positions``, a second row of positions; ``owners`` each slot's request when they were taken."""
        slots = values if values.ndim == 1 else values[0]
        n = len(slots)
        none = self._no_row_flags.get(n)
        if none is None:
            none = self._no_row_flags[n] = np.full(n, self.num_slots, dtype=np.int64).tobytes()
        if slots.tobytes() == none:
            return
        at = positions if positions is not None else values[1]
        for i in np.flatnonzero(slots < self.num_slots).tolist():
            self._fail(owners[int(slots[i])], int(at[i]))

    def _fail(self, request: GuardedRequest | None, position: int) -> None:
        """Fail ``request`` (the slot's owner when the copy was queued), left with no token at
        ``position``, unless it has failed already."""
        if request is None or request.error is not None:
            return  # (a failed request without a stop token stays flagged: already handled)
        request.fail(NO_TOKEN_LEFT.format(n=position))
        self.newly_failed.append(request)


def _gated(device: torch.device, args: tuple[Any, ...], eager: Callable[[], None]) -> None:
    """``dead_rows_(*args)`` through ``GATE``: on CUDA named by its variant (``kernels.dead_rows.variant``:
    the layout's and optional tensors' flags, dtypes), so a variant not compiled yet compiles off the
    step and ``eager()`` answers until it lands."""
    GATE.run_named(device, lambda: dead_rows_(*args), eager, dead_rows_kernels.variant, *args)
