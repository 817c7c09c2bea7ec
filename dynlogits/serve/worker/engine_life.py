"""The engine's life inside a worker: started in a thread at app start-up (so ``/health`` answers
meanwhile), watched until it dies, shut down with the app. A worker whose engine cannot start, or
died, exits (``state.on_fatal``) for its supervisor to start a new one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from dynlogits.policy.config import parse_reasoning
from dynlogits.policy.request import build_policy

from .args import DEFAULT_MODEL_NAME
from .state import WorkerState
from .vllm_engine import start_vllm_engine
from .worker_engine import WorkerEngine

__all__ = ["ENGINE_DEAD_EXIT", "ENGINE_WATCH_INTERVAL_S", "engine_lifespan"]

log = logging.getLogger("dynlogits.serve.worker")

#: How often the worker checks that its engine lives (a property read, no engine call).
ENGINE_WATCH_INTERVAL_S = 0.5
#: Exit status of a worker whose engine died (1: could not start, 2: bad config).
ENGINE_DEAD_EXIT = 3


def _start_engine(state: WorkerState) -> None:
    """Start the configured engine (blocking) and set ``state.engine`` and ``state.policy`` (with the
    model folder's default reasoning delimiters, ``model_reasoning``, where the operator set none)."""
    from dynlogits.model_builder import REASONING_FILE, default_model_dir, model_reasoning

    args = state.args
    model = args.model or str(default_model_dir())
    served = args.served_model_name or (args.model or DEFAULT_MODEL_NAME)
    engine: WorkerEngine[Any]
    if args.backend == "sglang":
        from .sglang_engine import start_sglang_engine

        engine = start_sglang_engine(model, served, args.engine_args, register_adapter=state.register_adapter)
    else:
        engine = start_vllm_engine(model, served, args.engine_args, register_adapter=state.register_adapter)
    declared = model_reasoning(model)
    default = parse_reasoning(declared, source=f"{model}/{REASONING_FILE}") if declared is not None else None
    state.policy = build_policy(args.disaggregation_mode, state.config, lambda: engine.tokenizer, engine.vocab_size,
                                default_reasoning=default)
    state.engine = engine


async def _start(state: WorkerState) -> None:
    """Start the engine off the event loop; a failure is reported on ``/ready`` and is fatal."""
    try:
        await asyncio.to_thread(_start_engine, state)
        log.info("worker ready: role=%s model=%s adapter=%s", state.args.disaggregation_mode.value,
                 state.engine.model_name if state.engine else "?", state.register_adapter)
    except Exception as err:  # noqa: BLE001 - reported on /ready and fatal
        state.start_error = f"{type(err).__name__}: {err}"
        log.exception("engine failed to start")
        if state.on_fatal is not None:
            state.on_fatal()


async def _watch_engine(state: WorkerState) -> None:
    """Once the engine has died (its core process gone: vLLM's ``errored``), record why, log it
    once and have the worker exit (``on_fatal``): a worker whose engine is dead can never serve
    again. In-flight requests end on their own with the engine's error."""
    while state.engine is None:
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
    engine = state.engine
    while (death := engine.death()) is None:
        await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
    state.stats.engine_dead = death
    log.error("engine died (%s); the worker exits (status %d) so that its supervisor can start a new one",
              state.stats.engine_dead, ENGINE_DEAD_EXIT)
    if state.on_fatal is not None:
        state.on_fatal()


def engine_lifespan(state: WorkerState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the engine starts and is watched from start-up, and is shut down after
    the server has drained its requests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_start(state))
        watch = asyncio.create_task(_watch_engine(state))
        try:
            yield
        finally:
            task.cancel()
            watch.cancel()
            if state.engine is not None:
                state.engine.shutdown()
            log.info("worker stopped: in-flight requests drained, engine shut down")

    return lifespan
