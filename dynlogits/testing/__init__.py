"""``dynlogits.testing``: the conformance kit every backend adapter must pass.

A backend author writes a driver (``AdapterDriver``: feeds rows and histories to the adapter the
way the engine does) and runs the checks (``CHECKS``, driven by the golden vectors in
``dynlogits.specs``) with ``dynlogits conformance pkg.mod:factory`` or from pytest::

    from dynlogits.testing import CHECKS, drivers_for, resolve, run_check

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
    def test_my_adapter_conforms(check):
        for driver in drivers_for(resolve("my_pkg.conformance:drivers")):
            outcome = run_check(check, driver)
            assert outcome.status != "failed", outcome.detail

The project's own adapters ship their drivers (``SHIPPED``: short name -> driver factory).
``import dynlogits.testing`` and ``SHIPPED`` load no torch; the rest loads it on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .shipped import SHIPPED

if TYPE_CHECKING:
    from .checks import CHECKS, Check, Skip
    from .driver import AdapterDriver, EngineReadFaults
    from .runner import KIT_VOCAB_SIZE, Outcome, drivers_for, resolve, run_check, run_conformance

_LAZY = {
    "CHECKS": "checks",
    "Check": "checks",
    "Skip": "checks",
    "AdapterDriver": "driver",
    "EngineReadFaults": "driver",
    "KIT_VOCAB_SIZE": "runner",
    "Outcome": "runner",
    "drivers_for": "runner",
    "resolve": "runner",
    "run_check": "runner",
    "run_conformance": "runner",
}

__all__ = [
    "CHECKS",
    "KIT_VOCAB_SIZE",
    "SHIPPED",
    "AdapterDriver",
    "Check",
    "EngineReadFaults",
    "Outcome",
    "Skip",
    "drivers_for",
    "resolve",
    "run_check",
    "run_conformance",
]


def __getattr__(name: str) -> Any:
    """Load the torch-using parts of the kit on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
