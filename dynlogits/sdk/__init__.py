"""``dynlogits.sdk``: the engine-neutral half of every backend adapter (docs/sdk.md).

An adapter translates its engine's calling convention onto four duties, each implemented once here:

1. activate (``gate``, ``put_payload``, ``encode_payload``, ``activate_logits_processors``,
   ``put_arrival``): the role-gated entries as the wire payload on the request, with the arrival the
   deployment stamped; a smuggled payload or arrival cleared (``carried_arrival`` reads it back);
2. realize (``validate``, ``realize``): payload -> a fresh ``GuardedRequest``; ``validate`` raises
   ``SpecError`` naming the field, ``realize`` never raises;
3. locate (``locate``): each row's request and history; positions come from the history alone;
4. apply: ``apply_rows`` / ``apply_row`` / ``apply_draft_row`` (rows and histories every step), or
   ``SlotBatch`` (built-in kinds resident per engine slot); a failing request is fail-stopped to its
   stop token (``pick_stop_token``) and reported once. Adapters call ``drain`` first in every
   engine call so device-found failures reach the host (``readback``).

No engine is imported; the activation half imports no torch, the rest loads it on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dynlogits.specs import WIRE_KEY, SpecError

from .activation import activate_logits_processors, carried_arrival, encode_payload, gate, put_arrival, put_payload

if TYPE_CHECKING:
    from .apply import apply_draft_row, apply_row, apply_rows
    from .guard import FailureReport, GuardedRequest, pick_stop_token
    from .locate import histories_from_ids
    from .readback import drain
    from .realization import RequestFacts, realize, validate
    from .resident import DeviceThinking, SlotBatch, TokenWindow

_LAZY = {
    "apply_draft_row": "apply",
    "apply_row": "apply",
    "apply_rows": "apply",
    "FailureReport": "guard",
    "GuardedRequest": "guard",
    "pick_stop_token": "guard",
    "histories_from_ids": "locate",
    "drain": "readback",
    "realize": "realization",
    "RequestFacts": "realization",
    "validate": "realization",
    "DeviceThinking": "resident",
    "SlotBatch": "resident",
    "TokenWindow": "resident",
}

__all__ = [
    "WIRE_KEY",
    "DeviceThinking",
    "FailureReport",
    "GuardedRequest",
    "RequestFacts",
    "SlotBatch",
    "SpecError",
    "TokenWindow",
    "activate_logits_processors",
    "apply_draft_row",
    "apply_row",
    "apply_rows",
    "carried_arrival",
    "drain",
    "encode_payload",
    "gate",
    "histories_from_ids",
    "pick_stop_token",
    "put_arrival",
    "put_payload",
    "realize",
    "validate",
]


def __getattr__(name: str) -> Any:
    """Load the torch-using parts on first use, so ``import dynlogits.sdk`` stays torch-free."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
