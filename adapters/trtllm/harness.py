"""Models of TensorRT-LLM's two call sites of logits processors, not the engine: test helpers.

Not for production: they exist so the adapter can be tested where TensorRT-LLM cannot run.

**These are harnesses, not TensorRT-LLM**: its wheel is not on the package index reachable here
(only a stub that downloads it from NVIDIA's own index) and it needs CUDA, so nothing of TensorRT-LLM
runs in this project's tests. They reproduce, from TensorRT-LLM's public sources, what the engine
hands a processor and what it does with the result:

* ``PytorchBackendHarness`` (``PyTorchModelEngine._execute_logit_post_processors``): one logits row
  per context request (called only when its prompt is complete) and ``beam_width`` rows per
  generation request; each of the request's processors is called as
  ``lp(req_id, view, token_ids, None, None)`` and its return value ignored. ``layout="beam"``
  (TensorRT-LLM PR 16010 and later): ``view`` is ``[beam, 1, vocab]`` over the rows, ``token_ids``
  one ``prompt + generated`` list per beam. ``layout="1.2"`` (1.2.x): a ``[1, 1, vocab]`` view of
  one row, ``token_ids = [prompt + generated]``, the row written back after the call.
* ``TrtBackendBatchedHarness``: the TensorRT backend's batched callback, one call per step with
  every opted-in request's ``[beam, 1, vocab]`` tensor, per-beam token lists, a stream pointer and
  the client ids.

Both model TensorRT-LLM's failure rule: an exception escaping a processor fails **every** active
request (``EngineFailure``), which the adapter must never cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = ["EngineFailure", "PytorchBackendHarness", "SamplingParamsStandIn", "TrtBackendBatchedHarness"]


class EngineFailure(RuntimeError):
    """A processor raised into the engine: TensorRT-LLM would fail every active request."""


@dataclass
class SamplingParamsStandIn:
    """The fields of TensorRT-LLM's ``SamplingParams`` the adapter reads and writes (the real class
    imports TensorRT-LLM's compiled bindings)."""

    end_id: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False


@dataclass
class _Request:
    req_id: int
    prompt: list[int]
    processors: list[Any]
    beams: list[list[int]]
    client_id: int | None = None
    in_context: bool = True

    def tokens(self) -> list[list[int]]:
        return [self.prompt + generated for generated in self.beams]


@dataclass
class _Harness:
    requests: dict[int, _Request] = field(default_factory=dict)

    def add(self, req_id: int, prompt: Sequence[int], sampling_params: Any, *, beam_width: int = 1,
            generated: Sequence[Sequence[int]] | None = None, client_id: int | None = None) -> None:
        """A request enters with ``sampling_params.logits_processor`` (as TensorRT-LLM copies it onto
        its request); ``generated``: tokens per beam from before a preemption (then it starts in the
        generation phase)."""
        lp = sampling_params.logits_processor
        processors = lp if isinstance(lp, list) else ([] if lp is None else [lp])
        beams = [list(g) for g in generated] if generated else [[] for _ in range(beam_width)]
        self.requests[req_id] = _Request(req_id, list(prompt), processors, beams, client_id, in_context=not generated)

    def commit(self, req_id: int, tokens: Sequence[int]) -> None:
        """The tokens sampled for each beam of ``req_id`` in the last step."""
        request = self.requests[req_id]
        for beam, token in zip(request.beams, tokens):
            beam.append(int(token))
        request.in_context = False

    def remove(self, req_id: int) -> None:
        self.requests.pop(req_id, None)

    def rows_of(self, req_id: int) -> int:
        request = self.requests[req_id]
        return 1 if request.in_context else len(request.beams)


class PytorchBackendHarness(_Harness):
    """See the module docstring."""

    def __init__(self, layout: Literal["beam", "1.2"] = "beam") -> None:
        super().__init__()
        self.layout = layout

    def step(self, order: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """One forward's logits (``[rows, vocab]``, requests' rows in ``order``, ``rows_of`` each)."""
        offset = 0
        for req_id in order:
            request = self.requests[req_id]
            width = self.rows_of(req_id)
            if request.processors:
                tokens = request.tokens()
                try:
                    if self.layout == "1.2":
                        if width != 1:
                            raise EngineFailure("TensorRT-LLM 1.2.x hands processors one row; beam search is not modelled")
                        view = logits[offset].view(1, 1, -1)
                        for lp in request.processors:
                            lp(request.req_id, view, tokens[:1], None, None)
                        logits[offset] = view.view(-1)
                    else:
                        view = logits[offset:offset + width].view(width, 1, -1)
                        for lp in request.processors:
                            lp(request.req_id, view, tokens[:width], None, None)
                except EngineFailure:
                    raise
                except Exception as exc:
                    raise EngineFailure(f"processor of request {req_id} raised; every active request fails: {exc!r}") from exc
            offset += width
        return logits


class TrtBackendBatchedHarness(_Harness):
    """See the module docstring. ``processor`` is the engine's one batched processor."""

    def __init__(self, processor: Any, *, stream_ptr: int = 0) -> None:
        super().__init__()
        self.processor = processor
        self.stream_ptr = stream_ptr

    def step(self, order: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """One step: ``logits`` is ``[rows, vocab]`` as for ``PytorchBackendHarness``; each request's
        rows are handed over as its own ``[beam, 1, vocab]`` tensor and copied back afterwards."""
        tensors, spans = [], []
        offset = 0
        for req_id in order:
            width = self.rows_of(req_id)
            tensors.append(logits[offset:offset + width].clone().view(width, 1, -1))
            spans.append((offset, width))
            offset += width
        requests = [self.requests[r] for r in order]
        try:
            self.processor([r.req_id for r in requests], tensors, [r.tokens()[:self.rows_of(r.req_id)] for r in requests],
                           self.stream_ptr, [r.client_id for r in requests])
        except Exception as exc:
            raise EngineFailure(f"batched processor raised; every active request fails: {exc!r}") from exc
        for tensor, (start, width) in zip(tensors, spans):
            logits[start:start + width] = tensor.view(width, -1)
        return logits
