"""Running the checks against the drivers of one adapter, for the CLI and for pytest.

``resolve(target)`` turns a shipped adapter's short name (``SHIPPED``) or ``pkg.mod:factory`` into
a driver factory; a factory is called with ``vocab_size=`` and returns one driver or a list of
them, each FRESH (the kit asks for new drivers before every check).
"""

from __future__ import annotations

import importlib
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO, cast

from .checks import CHECKS, Check, Skip
from .driver import AdapterDriver
from .shipped import SHIPPED

__all__ = ["KIT_VOCAB_SIZE", "SHIPPED", "Outcome", "drivers_for", "resolve", "run_check", "run_conformance"]

#: The logits width the kit asks drivers for (the embedded model's).
KIT_VOCAB_SIZE = 1024


DriverFactory = Callable[..., "AdapterDriver | Sequence[AdapterDriver]"]


@dataclass(frozen=True)
class Outcome:
    driver: str
    check: str
    status: Literal["passed", "failed", "skipped"]
    detail: str = ""


def resolve(target: str) -> DriverFactory:
    """The driver factory for a shipped adapter's short name or a ``module:attribute`` string."""
    path = SHIPPED.get(target, target)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown adapter {target!r}: use one of {list(SHIPPED)} or an import string 'pkg.mod:factory'")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path} is not callable")
    return cast(DriverFactory, obj)  # a callable: whether it makes drivers, drivers_for checks


def drivers_for(factory: DriverFactory, vocab_size: int = KIT_VOCAB_SIZE) -> list[AdapterDriver]:
    """Fresh drivers from ``factory``; ``TypeError`` when one does not implement the protocol."""
    made = factory(vocab_size=vocab_size)
    drivers: list[AdapterDriver] = []
    for d in made if isinstance(made, (list, tuple)) else [made]:
        if not isinstance(d, AdapterDriver):
            raise TypeError(f"{d!r} does not implement dynlogits.testing.AdapterDriver")
        drivers.append(d)
    return drivers


def run_check(check: Check, driver: AdapterDriver) -> Outcome:
    """Run one check on one fresh driver; never raises. The SDK's ERROR logs of the failures the
    checks provoke on purpose are silenced (the checks read the failure reports instead)."""
    sdk_logger = logging.getLogger("dynlogits.sdk")
    was_disabled, sdk_logger.disabled = sdk_logger.disabled, True
    try:
        check.run(driver)
    except Skip as why:
        return Outcome(driver.name, check.name, "skipped", str(why))
    except AssertionError as err:
        return Outcome(driver.name, check.name, "failed", str(err))
    except Exception as err:  # the adapter blew up: that is a failure too, with where
        where = traceback.format_exc(limit=-3).strip().splitlines()
        return Outcome(driver.name, check.name, "failed", f"{type(err).__name__}: {err} ({' | '.join(where[-3:])})")
    finally:
        sdk_logger.disabled = was_disabled
    return Outcome(driver.name, check.name, "passed")


def run_conformance(target: str, out: TextIO, checks: Sequence[Check] = CHECKS, *, kind: str | None = None,
                    entries: Sequence[Mapping[str, Any]] = ()) -> int:
    """Print one line per (driver, check) and a closing ``N passed, N failed`` line; the exit code:
    0 only when every check passed or was skipped with a reason and at least one passed.

    ``kind``: run the checks of that installed plug-in kind instead (``kind_checks``, with
    ``entries`` as its example entries, else its own: ``examples_of``), its name and distribution
    printed first; ``kind_checks.KindError`` (a ``ValueError``) when it is not installed or has no
    example entry."""
    if kind is not None:
        from .kind_checks import describe_kind, examples_of, kind_checks, plugin_kind

        declared = plugin_kind(kind)
        checks = kind_checks(declared, examples_of(declared, entries))
        print(describe_kind(declared), file=out)
    factory = resolve(target)
    first = drivers_for(factory)
    for d in first:
        print(f"adapter {target} / driver {d.name}: {d.exercised}", file=out)
    outcomes: list[Outcome] = []
    for index in range(len(first)):
        for check in checks:
            driver = drivers_for(factory)[index]
            outcome = run_check(check, driver)
            outcomes.append(outcome)
            line = f"{outcome.status.upper():7} {outcome.driver} :: {check.name}"
            print(line + (f" -- {outcome.detail}" if outcome.detail else ""), file=out, flush=True)
    passed = sum(o.status == "passed" for o in outcomes)
    failed = sum(o.status == "failed" for o in outcomes)
    skipped = sum(o.status == "skipped" for o in outcomes)
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""), file=out)
    return 0 if failed == 0 and passed > 0 else 1
