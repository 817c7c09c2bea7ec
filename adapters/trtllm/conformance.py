"""Conformance-kit drivers for the TensorRT-LLM adapter (``dynlogits conformance trtllm``).

TensorRT-LLM is not installed here (its wheel is not on the reachable package index and needs
CUDA), so the drivers run the real adapter classes inside the harnesses of
``dynlogits.adapters.trtllm.harness``, modelled on TensorRT-LLM's call sites:

* ``trtllm-pytorch``: a fresh ``DynamoTrtllmLogitsProcessor`` per request from
  ``activate``, pickled and unpickled as the request crosses into the executor,
  called as the PyTorch backend calls it (``[beam, 1, vocab]`` view, per-beam token lists);
* ``trtllm-batched``: the same processors registered with one ``DynamoTrtllmBatchedLogitsProcessor``
  and called as the TensorRT backend's batched callback.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch

from dynlogits import sdk
from dynlogits.roles import DisaggregationMode
from dynlogits.specs import LogitsProcessorSpec

from . import activation
from .batched import DynamoTrtllmBatchedLogitsProcessor
from .processor import FAILURES, HAS_TENSORRT_LLM, DynamoTrtllmLogitsProcessor
from .harness import PytorchBackendHarness, SamplingParamsStandIn, TrtBackendBatchedHarness

__all__ = ["TrtllmDriver", "drivers"]

_WHAT = ("TensorRT-LLM not installed (wheel not on the reachable index; needs CUDA): real adapter classes, "
         "{how} by a harness modelled on TensorRT-LLM's {site}")


class TrtllmDriver:
    """The kit's requests and steps, played through a TensorRT-LLM call-site harness."""

    releases_on_finish = True

    def __init__(self, vocab_size: int, *, batched: bool) -> None:
        self.vocab_size = vocab_size
        self.batched = batched
        self.name = "trtllm-batched" if batched else "trtllm-pytorch"
        self.exercised = _WHAT.format(
            how="one BatchedLogitsProcessor called" if batched else "per-request processors (pickled across the process "
            "boundary) called", site="TensorRT backend batched callback" if batched else "PyTorch backend "
            "(_execute_logit_post_processors, [beam, 1, vocab] views)")
        if HAS_TENSORRT_LLM:
            self.exercised = "TensorRT-LLM importable: adapter subclasses its LogitsProcessor; " + self.exercised
        self._started = False
        self.batched_processor = DynamoTrtllmBatchedLogitsProcessor()
        self.harness = TrtBackendBatchedHarness(self.batched_processor) if batched else PytorchBackendHarness()
        self.ids: dict[str, int] = {}

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        params = SamplingParamsStandIn(logits_processor=DynamoTrtllmLogitsProcessor([{"kind": "smuggled"}], prompt_len=0))
        processor = activation.activate(params, sdk.gate(spec, role), prompt_token_ids=[])
        if processor is None and params.logits_processor is not None:
            raise AssertionError("a processor attached earlier survived activation without entries")
        return None if processor is None else processor.payload

    def admit(self, payload: Any) -> None:
        sdk.validate(payload)  # what activate checks, for a raw payload

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int) -> None:
        if not self._started:  # the adapter's failure log is per process: start it afresh for this driver
            FAILURES.clear()
            self._started = True
        params = SamplingParamsStandIn(end_id=eos_token_id, apply_batched_logits_processor=self.batched)
        if payload is not None:
            params.logits_processor = DynamoTrtllmLogitsProcessor(payload, prompt_len=len(prompt_ids),
                                                                  stop_token_ids=(eos_token_id,))
        params = pickle.loads(pickle.dumps(params))  # requests reach the executor pickled
        number = self.ids.setdefault(req_id, len(self.ids))
        if self.batched:
            if params.logits_processor is not None:
                self.batched_processor.register(number, params.logits_processor)
            params.logits_processor = None
        self.harness.add(number, prompt_ids, params, generated=[list(output_ids)] if output_ids else None,
                         client_id=number)

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        return self.harness.step([self.ids[r] for r in batch], logits)

    def commit(self, req_id: str, token_id: int) -> None:
        self.harness.commit(self.ids[req_id], [token_id])

    def remove(self, req_id: str) -> None:
        number = self.ids[req_id]
        self.harness.remove(number)
        self.batched_processor.unregister(number)

    def held_requests(self) -> int:
        if self.batched:
            return len(self.batched_processor)
        return sum(bool(r.processors) for r in self.harness.requests.values())

    def failures(self) -> list[str]:
        return list(FAILURES)


def drivers(vocab_size: int) -> list[TrtllmDriver]:
    """The kit's factory: the PyTorch backend's per-request call and the TensorRT backend's batched call."""
    return [TrtllmDriver(vocab_size, batched=False), TrtllmDriver(vocab_size, batched=True)]
