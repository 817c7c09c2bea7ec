"""Host values to a device tensor without blocking, for the paths that plan on the host.

``to_device(values, dtype, device)`` is ``torch.tensor(values, dtype=dtype, device=device)``
without its blocking copy from pageable memory: on an accelerator the values go through a ring of
pinned buffers (``dynlogits.sdk.resident.staging.StepUpload``) with a non-blocking copy, and the
result is a fresh device tensor, valid for as long as it is referenced. On the CPU it is
``torch.tensor``.
"""

from __future__ import annotations

from collections.abc import Sequence

from typing import Any

import torch

__all__ = ["to_device"]

_RINGS: dict[tuple[torch.device, torch.dtype], Any] = {}  # StepUpload rings, 64 deep (about ten uploads a step)


def to_device(values: Sequence[float] | Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a new 1-D tensor on ``device`` (see the module doc)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype, device=device)
    if dtype == torch.bfloat16:  # numpy has no bfloat16: stage as float32, convert on the device
        return to_device(values, torch.float32, device).to(dtype)
    key = (device, dtype)
    ring = _RINGS.get(key)
    if ring is None:
        from .resident.staging import StepUpload  # imported late: the resident path imports the plans

        ring = _RINGS[key] = StepUpload(dtype, device, ring=64)
    n = len(values)
    ring.buffer(n)[:] = values
    return ring.upload(n)
