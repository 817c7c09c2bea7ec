"""``dynlogits.sdk``: the engine-neutral half of every backend adapter.

A backend adapter has four duties; each has one implementation here, so an adapter is only a
translation of its engine's calling convention onto them:

1. **activate** (``gate``, ``put_payload``, ``encode_payload``, ``activate_logits_processors``):
   put the role-gated entries where the engine carries per-request data, as the wire payload,
   clearing any payload a client smuggled in.
2. **realize** (``validate``, ``realize``): payload -> a fresh ``GuardedRequest`` per request;
   ``validate`` raises ``SpecError`` naming the field at admission, ``realize`` never raises.
3. **locate** (``dynlogits.sdk.locate``): name each logits row's request and history (generated
   tokens, drafts appended); positions come from the history alone.
4. **apply**: the rows of a batch, in place, with per-request failure isolation: a failing request
   is fail-stopped to its stop token (``pick_stop_token``) and reported once through the ``report``
   callback given to ``realize``. Two paths: ``apply_rows`` (``apply_row`` for one row,
   ``apply_draft_row`` for a speculative draft row) takes rows and histories every step (any
   engine, any kind; planned by ``plans``); ``SlotBatch`` (``dynlogits.sdk.resident``) keeps
   resident requests' built-in kinds on the device per persistent slot, for engines that have
   slots (no per-step planning). Failures found on the device reach the host without waiting
   for it: an adapter calls ``drain`` first in every call its engine makes, and a watcher thread
   covers an engine that goes idle (``dynlogits.sdk.readback``).

Layout: one module per duty (``activation``, ``realization``, ``locate``, ``guard`` with
``readback``, ``apply`` with ``plans``); ``resident/`` is the slot path's internals.

Nothing here imports an engine; the activation half imports no torch either (a frontend may use
it), the rest loads torch on first use. The conformance kit (``dynlogits.testing``) checks an adapter
against these contracts; ``docs/sdk.md`` walks through writing one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dynlogits.specs import WIRE_KEY, SpecError

from .activation import activate_logits_processors, encode_payload, gate, put_payload

if TYPE_CHECKING:
    from .apply import apply_draft_row, apply_row, apply_rows
    from .guard import FailureReport, GuardedRequest, pick_stop_token
    from .locate import histories_from_ids
    from .readback import drain
    from .realization import realize, validate
    from .resident import DeviceThinking, SlotBatch

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
    "validate": "realization",
    "DeviceThinking": "resident",
    "SlotBatch": "resident",
}

__all__ = [
    "WIRE_KEY",
    "DeviceThinking",
    "FailureReport",
    "GuardedRequest",
    "SlotBatch",
    "SpecError",
    "activate_logits_processors",
    "apply_draft_row",
    "apply_row",
    "apply_rows",
    "drain",
    "encode_payload",
    "gate",
    "histories_from_ids",
    "pick_stop_token",
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
