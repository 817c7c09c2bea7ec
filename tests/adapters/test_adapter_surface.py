"""Every shipped adapter speaks the same duty names: ``activate``, ``validate``, ``Processor`` and
its conformance driver, so moving a deployment from one engine to another changes an import,
not the code around it."""

from __future__ import annotations

import importlib
import inspect

import pytest

SHIPPED = ("vllm", "sglang", "trtllm", "transformers")


@pytest.mark.parametrize("name", SHIPPED)
def test_every_adapter_exposes_activate_validate_and_its_processor_class(name: str) -> None:
    adapter = importlib.import_module(f"dynlogits.adapters.{name}")
    assert callable(adapter.activate) and callable(adapter.validate)
    assert inspect.isclass(adapter.Processor)
    assert {"activate", "validate", "Processor"} <= set(adapter.__all__)
    drivers = importlib.import_module(f"dynlogits.adapters.{name}.conformance").drivers
    assert callable(drivers)

