"""What ``GET /stats`` reports beyond counters: the adapter's per-request state and the memory in use.

The adapter runs in vLLM's model-runner process, so :class:`AdapterIntrospection` is mixed into
vLLM's worker class (``--worker-extension-cls``) and answers ``collective_rpc("dynlogits_adapter_requests")``;
:func:`process_tree_rss` sums the resident memory of the worker and its engine processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["EXTENSION_CLASS", "AdapterIntrospection", "adapter_requests", "process_tree_rss"]

log = logging.getLogger("dynlogits.serve.worker")

EXTENSION_CLASS = "dynlogits.serve.worker.introspect.AdapterIntrospection"
_RPC = "dynlogits_adapter_requests"


class AdapterIntrospection:
    """Mixed into vLLM's worker class; runs in the model-runner process."""

    def dynlogits_adapter_requests(self) -> int | None:
        """Requests the dynlogits adapter holds state for, or ``None`` when it is not loaded here."""
        from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

        runner = getattr(self, "model_runner", None)
        procs = getattr(getattr(getattr(runner, "input_batch", None), "logitsprocs", None), "all", None)
        if procs is None:
            return None
        counts = [p.held_requests() for p in procs if isinstance(p, DynamoVllmLogitsProcessor)]
        return sum(counts) if counts else None


async def adapter_requests(engine: AsyncLLM, timeout_s: float = 5.0) -> int | None:
    """Sum over the engine's workers of :meth:`AdapterIntrospection.dynlogits_adapter_requests`;
    ``None`` when the engine does not answer in time. Call it only on an engine whose workers have
    the extension: on others the call raises inside the engine, which logs it as an engine error."""
    try:  # bounded here too: the engine answers utility calls only between its steps
        results = await asyncio.wait_for(engine.collective_rpc(_RPC, timeout=timeout_s), timeout_s)
    except Exception as err:  # noqa: BLE001 - an observability read never fails the caller
        log.debug("adapter state unavailable: %s", err)
        return None
    known = [r for r in results if isinstance(r, int)]
    return sum(known) if known else None


def process_tree_rss() -> dict[str, int]:
    """Resident memory (bytes) of this process (``"worker"``) and of each descendant, keyed by its
    title (vLLM names its processes ``VLLM::EngineCore``, ``VLLM::Worker``); ``{}`` without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    me = psutil.Process(os.getpid())
    out: dict[str, int] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            title = "worker" if p.pid == me.pid else (p.cmdline() or [p.name()])[0].split("/")[-1]
            out[title] = out.get(title, 0) + p.memory_info().rss
        except psutil.Error:
            continue
    return out
