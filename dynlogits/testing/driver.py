"""What a backend author supplies to the conformance kit: a driver that feeds rows and histories to
their adapter the way their engine does.

A driver owns one adapter instance and speaks in requests and steps; the kit never touches the
engine's classes. The driver keeps token histories (``commit``) where the engine keeps them, so the
adapter reads them through its own ``locate`` code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import LogitsProcessorSpec

__all__ = ["AdapterDriver", "EngineReadFaults"]


@runtime_checkable
class AdapterDriver(Protocol):
    """One adapter, driven as its engine drives it.

    Attributes:
        name: short name printed by the kit (``vllm-v1``).
        exercised: which engine classes run: the engine's real classes, or a harness and why.
        vocab_size: the logits width the adapter was built with.
        releases_on_finish: whether the adapter drops a request's state when it ends; ``False``
            for engines that recycle slots without a removal call (state is then replaced when
            the slot is reused, and the kit checks that instead).
    """

    name: str
    exercised: str
    vocab_size: int
    releases_on_finish: bool

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        """The payload this adapter's activation puts on a request on a worker of ``role``
        (``None`` when it puts nothing)."""

    def admit(self, payload: Any) -> None:
        """The engine's admission check: raise ``ValueError`` (``SpecError``) for a bad payload."""

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        """A request enters the batch (``output_ids`` non-empty: it resumes after preemption). Its facts
        reach the adapter's realization where the engine carries them: the prompt ``prompt_ids``, the
        ids it stops on (``eos_token_id``, then ``stop_token_ids``) and ``arrival_time`` (the
        ``time.time()`` the deployment stamped at activation; ``None``: not stamped)."""

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        """Process one step: row ``i`` of ``logits`` belongs to ``batch[i]``; returns the processed
        logits (the same tensor when the engine edits in place). ``logits`` is a fresh CPU
        ``float32`` C-contiguous ``[len(batch), vocab_size]`` tensor; a driver converts it to what
        its engine hands the adapter."""

    def commit(self, req_id: str, token_id: int) -> None:
        """Append a sampled token to the request's history."""

    def remove(self, req_id: str) -> None:
        """The request ends (finished, aborted or preempted)."""

    def held_requests(self) -> int:
        """How many requests the adapter holds per-request state for: entries of its request table,
        or, for an adapter that keeps no table (the engine owns each request's processors), the
        live requests that still carry one of its processors."""

    def failures(self) -> list[str]:
        """The failure reports the adapter made so far (``dynlogits.sdk.FailureReport``)."""


@runtime_checkable
class EngineReadFaults(Protocol):
    """Optional, for a driver whose adapter reads engine objects at every step (SGLang's ``Req``,
    TensorRT-LLM's request state): the kit then checks that a failed read fails only its request."""

    def break_engine_reads(self, req_id: str) -> None:
        """Make every engine object the adapter reads per step for ``req_id`` fail that read from
        now on, as a different engine version would (delete the attribute it reads, or replace
        the object with one lacking it)."""
