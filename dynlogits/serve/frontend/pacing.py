"""Per-client pacing of the CPU a client's requests cost before they reach the engine.

Reading, parsing and admitting a request's logits entries (the frontend's validation, then the
worker's parse and admission: text, limits, the consistency walks within ``max_admission_work``)
cost CPU on the machine that runs the engine. A client sending costly payloads in a loop, even ones
refused, would take that CPU from everyone. :class:`CostPacer` keeps each client's debt of such CPU
in milliseconds, paid back at ``rate_ms_per_s``: a request from a client whose debt is over
``burst_ms`` waits, before its body is read, until it is back under (a costly client is slowed,
the others are not); one that would wait longer than ``max_wait_s`` is refused with 429.

Only bodies that carry logits entries (``logits_processors``, or a control mapped onto a kind) are
charged: the walks, the texts to resolve and the payload's size are theirs; other bodies' costs are
bounded by the per-request limits. The charge is what the frontend measures of its own validation (thread CPU time, synchronous)
times ``COST_FACTOR``, which stands for the JSON parse before it and the worker's share after it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from dynlogits.serve.control_fields import CONTROL_FIELDS
from dynlogits.serve.openai_controls import ROOT

__all__ = ["COST_FACTOR", "CostPacer", "carries_entries"]

#: The whole cost of a request's body (the frontend's JSON parse and validation, then the worker's parse
#: and admission) as a multiple of the frontend's validation of it: the ratio measured for the costly
#: payload (``dynlogits.tools.load.costly``; ``docs/reliability.md``, "Admission").
COST_FACTOR = 5.0


def carries_entries(data: Any) -> bool:
    """Whether a request body (JSON, not yet validated) carries logits entries or their controls."""
    return isinstance(data, dict) and any(data.get(name) is not None for name in (ROOT, *CONTROL_FIELDS))


@dataclass
class CostPacer:
    """Each client's CPU debt (ms), paid back at ``rate_ms_per_s``; at most ``max_clients`` tracked
    (the least recently charged ones, whose debt is oldest, are forgotten first)."""

    rate_ms_per_s: float = 50.0
    burst_ms: float = 100.0
    max_clients: int = 65_536
    _debt: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)  # client -> (ms, when)

    def _owed(self, client: str, now: float) -> float:
        held = self._debt.get(client)
        if held is None:
            return 0.0
        ms, when = held
        return max(0.0, ms - (now - when) * self.rate_ms_per_s)

    def wait_s(self, client: str) -> float:
        """How long ``client``'s next request must wait before its body is read (0: at once)."""
        over = self._owed(client, time.monotonic()) - self.burst_ms
        return over / self.rate_ms_per_s if over > 0 else 0.0

    def charge(self, client: str, cpu_ms: float) -> None:
        """Add ``cpu_ms`` of CPU (already scaled by ``COST_FACTOR``) to ``client``'s debt."""
        now = time.monotonic()
        self._debt[client] = (self._owed(client, now) + cpu_ms, now)
        self._debt.move_to_end(client)
        while len(self._debt) > self.max_clients:
            self._debt.popitem(last=False)
