"""Session-scoped real vLLM engines on the embedded model, each configuration started once.

Engines take 35-60 s to start on a 2-core machine, so the whole package shares:

* ``adapter_llm``  — offline ``LLM`` (multiprocessing on), adapter passed as a class object;
* ``baseline_llm`` — the same engine configuration without the adapter (greedy reference);
* ``async_engine`` — ``AsyncLLM`` (multiprocessing on), adapter installed by
  ``register_dynamo_logits_processor`` as an import string, with a KV cache of 5 blocks of 32
  tokens so concurrent requests are preempted and resumed; it counts preemptions from the
  engine's own iteration stats.

The fault-injection factories are allow-listed for every engine (operator setting), and callables
may be sent to workers (``collective_rpc``) to read the adapter's failure records and counters.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dynlogits.adapters.vllm.harness import RAISE_AFTER_FACTORY
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.testing.faults import BAN_ID_FACTORY

T = TypeVar("T")

ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.2,
    "seed": 0,
}
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    PYTHON_FACTORIES_ENV: f"{RAISE_AFTER_FACTORY},{BAN_ID_FACTORY}",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc with a callable (failure records)
}
#: Tiny KV cache for the preemption engine: 5 blocks x 32 tokens = 160 tokens.
TINY_KV = {"max_model_len": 128, "block_size": 32, "num_gpu_blocks_override": 5}


@pytest.fixture(scope="session")
def engine_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENGINE_ENV.items():
            mp.setenv(key, value)
        yield


def _shutdown(llm: Any) -> None:
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="session")
def adapter_llm(engine_env: None, embedded_model: Path) -> Iterator[Any]:
    from vllm import LLM

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

    llm = LLM(str(embedded_model), max_model_len=512, max_num_seqs=32,
              logits_processors=[DynamoVllmLogitsProcessor], **ENGINE_KWARGS)
    yield llm
    _shutdown(llm)


@pytest.fixture(scope="session")
def baseline_llm(engine_env: None, embedded_model: Path) -> Iterator[Any]:
    from vllm import LLM

    llm = LLM(str(embedded_model), max_model_len=512, max_num_seqs=32, **ENGINE_KWARGS)
    yield llm
    _shutdown(llm)


class AsyncEngine:
    """An ``AsyncLLM`` living on its own event-loop thread (its output handler is bound to one loop)."""

    def __init__(self, model: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="async-llm-loop", daemon=True)
        self._thread.start()
        self.preemptions: list[int] = []
        self.engine: Any = self.run(self._start(model))

    async def _start(self, model: Path) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from dynlogits.adapters.vllm import register_dynamo_logits_processor

        args = register_dynamo_logits_processor(AsyncEngineArgs(model=str(model), **ENGINE_KWARGS, **TINY_KV))
        return AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger_factory()])

    def _stat_logger_factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        sink = self.preemptions

        class PreemptionCounter(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                       engine_idx: int = 0) -> None:
                if iteration_stats is not None and iteration_stats.num_preempted_reqs:
                    sink.append(iteration_stats.num_preempted_reqs)

            def log_engine_initialized(self) -> None:
                pass

        return PreemptionCounter

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 300) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def generate(self, prompt: str, params: Any, request_id: str) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id=request_id):
            final = out
        return final

    def close(self) -> None:
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="session")
def async_engine(engine_env: None, embedded_model: Path) -> Iterator[AsyncEngine]:
    engine = AsyncEngine(embedded_model)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_config(embedded_model: Path) -> Any:
    """A real ``VllmConfig`` for the embedded model (no engine started)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(embedded_model), max_model_len=512, **ENGINE_KWARGS).create_engine_config()


@pytest.fixture(scope="session", autouse=True)
def _quiet_tokenizers() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
