"""Conformance-kit drivers for the TensorRT-LLM adapter (``dynlogits conformance trtllm``).

The drivers run the real adapter classes inside ``harness`` (TensorRT-LLM is not installed here).
The kit speaks one row per request; with beams, every beam shares the kit's history and must come
out the same (beam 0's row is returned); with drafts, draft rows follow it:

* ``trtllm-pytorch``: PyTorch backend, ``[1, 1, vocab]``;
* ``trtllm-pytorch-beams``: PyTorch backend, 4 beams, ``[4, 1, vocab]`` (``[1, 1, vocab]`` at context);
* ``trtllm-tensorrt-beams``: TensorRT backend, 4 beams, ``[1, 4, vocab]``;
* ``trtllm-tensorrt-drafts``: TensorRT backend, ``[1 + 2, 1, vocab]`` (acceptance not modelled);
* ``trtllm-batched``: the TensorRT backend's batched callback, executor API in this process.

Per-request drivers go through the LLM API path (requests pickled into the executor process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dynlogits import sdk
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import LogitsProcessorSpec

from . import activation
from .batched import DynamoTrtllmBatchedLogitsProcessor
from .harness import PytorchBackendHarness, SamplingParamsStandIn, TrtBackendHarness
from .processor import FAILURES, HAS_TENSORRT_LLM, DynamoTrtllmLogitsProcessor

__all__ = ["TrtllmDriver", "drivers"]

_WHAT = ("TensorRT-LLM not installed (wheel not on the reachable index; needs CUDA): real adapter classes driven by a "
         "harness modelled on TensorRT-LLM 1.3.0rc29's {site}")


class TrtllmDriver:
    """The kit's requests and steps, played through a TensorRT-LLM call-site harness."""

    releases_on_finish = True

    def __init__(self, vocab_size: int, *, backend: str, beams: int = 1, drafts: int = 0, batched: bool = False) -> None:
        self.vocab_size = vocab_size
        self.beams, self.drafts, self.batched = beams, drafts, batched
        suffix = "-batched" if batched else "-drafts" if drafts else "-beams" if beams > 1 else ""
        self.name = "trtllm-batched" if batched else f"trtllm-{backend}{suffix}"
        if backend == "pytorch":
            views = f"[{beams}, 1, vocab] views, [1, 1, vocab] at the context step" if beams > 1 else "[1, 1, vocab] views"
            site = f"PyTorch backend (_execute_logit_post_processors: {views}; requests pickled into the executor process)"
            self.harness: PytorchBackendHarness | TrtBackendHarness = PytorchBackendHarness()
        elif batched:
            site = "TensorRT backend batched callback (LogitsPostProcessor, executor API in this process, [1, 1, vocab])"
            self.batched_processor = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=None)
            self.harness = TrtBackendHarness(self.batched_processor, llm_api=False)
        else:
            shape = f"[1 + {drafts}, {beams}, vocab]" if drafts else f"[1, {beams}, vocab]"
            site = (f"TensorRT backend per-request callback (LogitsPostProcessor on {shape} decoder logits"
                    + ("; draft rows after a row not forced to one token are masked to the stop token, with a WARNING"
                       if drafts else "") + "; requests pickled into the executor process)")
            self.harness = TrtBackendHarness()
        self.exercised = _WHAT.format(site=site)
        if HAS_TENSORRT_LLM:
            self.exercised = "TensorRT-LLM importable: adapter subclasses its LogitsProcessor; " + self.exercised
        self._started = False
        self.ids: dict[str, int] = {}

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        params = SamplingParamsStandIn(logits_processor=DynamoTrtllmLogitsProcessor([{"kind": "smuggled"}]))
        processor = activation.activate(params, sdk.gate(spec, role))
        if processor is None and params.logits_processor is not None:
            raise AssertionError("a processor attached earlier survived activation without entries")
        return None if processor is None else processor.payload

    def admit(self, payload: Any) -> None:
        sdk.validate(payload)  # what activate checks, for a raw payload

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        if not self._started:  # the adapter's failure log is per process: start it afresh for this driver
            FAILURES.clear()
            self._started = True
        number = self.ids.setdefault(req_id, len(self.ids))
        params = SamplingParamsStandIn(end_id=eos_token_id, stop_token_ids=list(stop_token_ids) or None)
        if payload is not None:
            params.logits_processor = DynamoTrtllmLogitsProcessor(
                payload, sampling_params=params, generated_before=len(output_ids), vocab_size=self.vocab_size,
                arrival_time=arrival_time)  # what activate() stamps (activate: now, when not given)
        params.apply_batched_logits_processor = self.batched and payload is not None  # only requests with processors
        generated = [list(output_ids)] * self.beams if output_ids else None
        if isinstance(self.harness, PytorchBackendHarness):
            self.harness.add(number, prompt_ids, params, beam_width=self.beams, generated=generated)
            return
        if self.batched and params.logits_processor is not None:
            self.batched_processor.register(number, params.logits_processor)
            params.logits_processor = None  # its own processor would take precedence over the batched one
        self.harness.add(number, prompt_ids, params, beam_width=self.beams, generated=generated, draft_len=self.drafts,
                         client_id=number)

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        numbers = [self.ids[r] for r in batch]
        out = self.harness.step({n: logits[i] for i, n in enumerate(numbers)})
        for i, n in enumerate(numbers):
            # PyTorch backend: [rows, vocab]; TensorRT backend: [1 + draft, beam, vocab] -> position 0's beams
            beams = out[n] if out[n].ndim == 2 else out[n][0]
            if not all(torch.equal(beams[0], beam) for beam in beams[1:]):
                raise AssertionError(f"request {batch[i]}: beams with the same history were processed differently")
            logits[i] = beams[0]
        return logits

    def commit(self, req_id: str, token_id: int) -> None:
        self.harness.commit(self.ids[req_id], [token_id] * self.beams)

    def remove(self, req_id: str) -> None:
        number = self.ids[req_id]
        self.harness.remove(number)
        if self.batched:
            self.batched_processor.unregister(number)

    def break_engine_reads(self, req_id: str) -> None:
        self.harness.break_reads(self.ids[req_id])

    def held_requests(self) -> int:
        if self.batched:
            return len(self.batched_processor)
        return sum(bool(r.processors) for r in self.harness.requests.values())

    def failures(self) -> list[str]:
        return list(FAILURES)


def drivers(vocab_size: int) -> list[TrtllmDriver]:
    """The kit's factory: TensorRT-LLM 1.3.0rc29's logits layouts ``[1, 1, vocab]``, ``[beam, 1, vocab]``
    (PyTorch backend), ``[1, beam, vocab]`` and ``[1 + draft, 1, vocab]`` (TensorRT backend), and the
    TensorRT backend's batched callback."""
    return [
        TrtllmDriver(vocab_size, backend="pytorch"),
        TrtllmDriver(vocab_size, backend="pytorch", beams=4),
        TrtllmDriver(vocab_size, backend="tensorrt", beams=4),
        TrtllmDriver(vocab_size, backend="tensorrt", drafts=2),
        TrtllmDriver(vocab_size, backend="tensorrt", batched=True),
    ]
