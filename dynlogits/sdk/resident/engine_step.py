"""What the engine gives one resident step beside the logits: ``EngineStep``, one typed input for
every engine mode, and the type of a device decider (``ThinkingDecider``).

Each engine fills what it has, and leaves the rest ``None``:

============================================  =============================================================
engine mode                                   fields
============================================  =============================================================
host histories (vLLM V1, the CUDA check)      ``histories``
runner positions, listed (Model Runner V2)    ``pos``, ``pos_offset``, ``thinking``, ``window``
device positions, gathered (V2 with drafts)   ``generated``, ``thinking``, ``window``, ``real_rows``
============================================  =============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dynlogits.processors.modes import DecidedGroup
from dynlogits.processors.slots import GatheredRows
from dynlogits.processors.window import TokenWindow

__all__ = ["NO_INPUT", "EngineStep", "ThinkingDecider"]

#: Device decisions for a decided group (``modes.SpanDecided``: ``DeviceThinking.decide``) when the
#: host has no histories: ``(group, rows) -> tokens`` (the token to force per row, -1 for none).
ThinkingDecider = Callable[[DecidedGroup, GatheredRows], torch.Tensor]


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One step's inputs from the engine (see the module doc); all optional, none read back.

    Positions come from ``histories`` (listed layout: host lists, one per logits row, whose lengths
    are uploaded), ``generated`` (row-indexed device counts), or ``pos`` and ``pos_offset``
    (``generated = pos - pos_offset``; ``pos_offset`` the same tensor while the listed layout stays).

    Raises:
        ValueError: ``pos`` without ``pos_offset``."""

    #: every logits row's generated tokens, as host lists (listed layout); decided groups are then
    #: decided on the host from them
    histories: Sequence[Sequence[int]] | None = None
    #: the number of tokens each row's request generated before the row (row-indexed, device)
    generated: torch.Tensor | None = None
    #: each row's position as the runner holds it, and what to subtract for ``generated``
    pos: torch.Tensor | None = None
    pos_offset: torch.Tensor | None = None
    #: decides the span-decided groups on the device where there are no ``histories``
    thinking: ThinkingDecider | None = None
    #: every row's last tokens on the device, for the window-decided groups without ``histories``
    window: TokenWindow | None = None
    #: gathered layout: which rows are committed (not drafts): a draft row left with no token is
    #: stopped but its request is not failed (the draft may be rejected)
    real_rows: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.pos is not None and self.pos_offset is None:
            raise ValueError("EngineStep: pos needs pos_offset (generated = pos - pos_offset)")


#: A step with no engine input (positions and decisions not needed, or not known).
NO_INPUT = EngineStep()
