"""Every shipped adapter speaks the same duty names (``dynlogits.sdk.adapter``): ``Processor``,
``activate``, ``validate`` and ``stop_token``, with the same leading parameters where the engines
allow, and its conformance driver, so moving a deployment from one engine to another changes an
import, not the code around it."""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import pytest

from dynlogits.sdk.adapter import ADAPTER_NAMES

SHIPPED = ("vllm", "sglang", "trtllm", "transformers")
#: transformers' generate() has no per-request object before it runs (dynlogits.sdk.adapter)
NO_PER_REQUEST_TARGET = {"transformers"}


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_adapter_exports_the_shared_names(name: str) -> None:
    adapter = importlib.import_module(f"dynlogits.adapters.{name}")
    assert set(ADAPTER_NAMES) <= set(adapter.__all__)
    assert inspect.isclass(adapter.Processor)
    assert all(callable(getattr(adapter, n)) for n in ADAPTER_NAMES)
    assert callable(importlib.import_module(f"dynlogits.adapters.{name}.conformance").drivers)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_verbs_take_the_same_leading_parameters(name: str) -> None:
    adapter = importlib.import_module(f"dynlogits.adapters.{name}")
    assert "vocab_size" in _params(adapter.validate)
    assert _params(adapter.stop_token)[1] == "vocab_size"
    if name not in NO_PER_REQUEST_TARGET:
        assert _params(adapter.activate)[1] == "entries"


@pytest.mark.parametrize(("name", "source", "want"), [
    ("vllm", SimpleNamespace(eos_token_id=7, stop_token_ids=[3]), 7),
    ("vllm", SimpleNamespace(eos_token_id=None, stop_token_ids=[9, 3]), 3),
    ("trtllm", SimpleNamespace(end_id=7, ignore_eos=False, stop_token_ids=[3]), 7),
    ("trtllm", SimpleNamespace(end_id=7, ignore_eos=True, stop_token_ids=[9, 3]), 3),
    ("sglang", SimpleNamespace(eos_token_ids={7, 5}, sampling_params=SimpleNamespace(ignore_eos=False, stop_token_ids=None)), 5),
    ("transformers", SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, 2])), 7),
])
def test_stop_token_names_the_token_a_failed_request_is_ended_with(name: str, source: object, want: int) -> None:
    adapter = importlib.import_module(f"dynlogits.adapters.{name}")
    assert adapter.stop_token(source, 64) == want
    assert adapter.stop_token(source, 2) is None  # outside the logits width: no stop token
