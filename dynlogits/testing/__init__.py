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

The project's own adapters ship their drivers (``SHIPPED``).
"""

from .checks import CHECKS, Check, Skip
from .driver import AdapterDriver
from .runner import KIT_VOCAB_SIZE, SHIPPED, Outcome, drivers_for, resolve, run_check, run_conformance

__all__ = [
    "CHECKS",
    "KIT_VOCAB_SIZE",
    "SHIPPED",
    "AdapterDriver",
    "Check",
    "Outcome",
    "Skip",
    "drivers_for",
    "resolve",
    "run_check",
    "run_conformance",
]
