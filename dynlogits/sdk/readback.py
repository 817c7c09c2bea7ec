"""Reading small device results back on the host without waiting for the device.

The apply paths find out *on the device* that a request must fail (its row has no token left);
the row is fail-stopped there at once, and the host only needs to learn it later, to record the
failure and report it. ``DeviceFlags`` copies a small boolean tensor to pinned host memory with a
non-blocking copy and an event, and answers ``None`` until the copy has landed, so no step ever
waits for the device. On the CPU the value is there at once.
"""

from __future__ import annotations

import torch

__all__ = ["DeviceFlags"]


class DeviceFlags:
    """A snapshot of a 1-D bool device tensor, readable on the host once the device wrote it."""

    __slots__ = ("_event", "_host", "_values")

    def __init__(self, flags: torch.Tensor) -> None:
        self._values: list[bool] | None = None
        self._event = None
        if flags.device.type != "cpu":
            self._host = torch.empty(flags.shape, dtype=torch.bool, pin_memory=True)
            self._host.copy_(flags, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = flags.detach().clone()

    def ready(self) -> list[bool] | None:
        """The flags, or ``None`` while the copy is still in flight. Never blocks."""
        if self._values is None and (self._event is None or self._event.query()):
            self._values = self._host.tolist()
        return self._values
