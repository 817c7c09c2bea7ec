"""Every engine behind a worker implements the ``WorkerEngine`` contract as a sibling: the same members
with the same parameters (so every keyword the worker passes, ``generate``'s entry names included,
reaches each engine), no engine a subclass of another. SGLang's engine needs a GPU: only its class
is inspected here (``tests/adapters/sglang/test_sglang_worker.py`` drives it with a stand-in stream)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from dynlogits.serve.worker.sglang_engine import SglangEngine, SglangHandle
from dynlogits.serve.worker.vllm_engine import VllmEngine
from dynlogits.serve.worker.worker_engine import WorkerEngine

ENGINES = [VllmEngine, SglangEngine]
#: What the contract declares, read from the Protocol itself.
MEMBERS = sorted(name for name in vars(WorkerEngine) if not name.startswith("_") and name not in {"ParamsT"})


def _parameters(function: Callable[..., object]) -> list[tuple[str, object, bool]]:
    """Name, kind and whether it has a default, for each parameter (annotations differ per engine)."""
    return [(p.name, p.kind, p.default is not p.empty) for p in inspect.signature(function).parameters.values()]


def test_the_contract_names_what_the_worker_calls() -> None:
    assert {"render_prompt", "sampling_params", "generate", "abort", "check_health", "adapter_requests", "death",
            "shutdown", "model_name", "max_model_len", "vocab_size", "adapter_registered", "tokenizer"} <= set(MEMBERS)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_each_engine_has_every_member_with_the_contracts_parameters(engine: type) -> None:
    fields = set(getattr(engine, "__dataclass_fields__", {}))
    for name in MEMBERS:
        declared = vars(WorkerEngine)[name]
        if isinstance(declared, property):
            assert name in fields or isinstance(getattr(engine, name, None), property), f"{engine.__name__}.{name}"
            continue
        own = getattr(engine, name)
        assert _parameters(own) == _parameters(declared), f"{engine.__name__}.{name}"
        assert inspect.iscoroutinefunction(own) == inspect.iscoroutinefunction(declared), f"{engine.__name__}.{name}"


def test_the_engines_are_siblings() -> None:
    assert not issubclass(SglangEngine, VllmEngine) and not issubclass(VllmEngine, SglangEngine)


def test_a_dead_vllm_engine_says_why_and_a_live_one_nothing() -> None:
    def engine(**state: object) -> VllmEngine:
        return VllmEngine(engine=SimpleNamespace(**state), tokenizer=None, model_name="m", max_model_len=8,
                          vocab_size=8, adapter_registered=False)

    assert engine(errored=False).death() is None
    assert engine(errored=True, dead_error=RuntimeError("core gone")).death() == "RuntimeError: core gone"
    assert engine(errored=True).death() == "engine errored"
    assert asyncio.run(engine(errored=False).adapter_requests()) is None  # no introspection: not asked


def test_an_sglang_engine_without_its_engine_is_unhealthy_and_aborts_nothing() -> None:
    engine = SglangEngine(engine=SglangHandle(None), tokenizer=None, model_name="m", max_model_len=8, vocab_size=8,
                          adapter_registered=False)
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(engine.check_health())
    asyncio.run(engine.abort("r-1"))
    assert engine.death() is None and asyncio.run(engine.adapter_requests()) is None
