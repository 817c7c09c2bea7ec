"""Harnesses modelled on TensorRT-LLM 1.3.0rc29's logits-processor call sites (tests, conformance kit).

TensorRT-LLM cannot be installed here, so these classes reproduce from its public sources
(github NVIDIA/TensorRT-LLM; the v1.3.0rc29 tag could not be read, so each source names the commit
or PR read) what the engine hands a processor and what it does with the result:

[P1] ``tensorrt_llm/_torch/pyexecutor``: ``_execute_logit_post_processors`` /
     ``_apply_logits_processors`` (since PR 16010, read in later main): context requests' rows
     first, one row each (``token_ids = [get_tokens(0)]``; skipped when ``py_orig_prompt_len <
     len(tokens)``), then ``get_beam_width_by_iter()`` rows per generation request (one
     ``get_tokens(beam)`` list per beam); the signature must take 4 or 5 parameters (an ``assert``);
     called as ``lp(py_request_id, rows.view(beam, 1, -1), token_ids, None, None)``, return ignored.
[P2] ``_torch/pyexecutor/llm_request.py`` ``LlmRequest.create_child_request``: ``n > 1`` samples
     get a ``deepcopy`` of every ``py_*`` attribute, processors included.
[T1] ``cpp/tensorrt_llm/batch_manager/logitsPostProcessor.cpp`` ``LogitsPostProcessor::operator()``
     @ 23bf695f90898b58862ed6ff6c5e3e5416b938cd: a request's own processor ``(mRequestId,
     decoderLogits, getTokens(), stream, mClientId)``, else (never both) the one batched call
     ``(reqIds, logits, beamTokens, stream, clientIds)``; first TP rank only unless replicated.
[T2] ``cpp/tensorrt_llm/batch_manager/handleContextLogits.cpp`` / ``handleGenerationLogits.cpp``
     @ 0165bd7ac275dae69796767cdbb71ce1963506f3: ``[1, beam, vocab]`` for beam > 1 (tiled at
     context, a view after), ``[1 + draft, 1, vocab]`` for beam 1; ``TLLM_CHECK(draftLength == 0 ||
     reqBeamWidth == 1)``.
[T3] ``cpp/include/tensorrt_llm/batch_manager/llmRequest.h`` ``getTokens()``: prompt + generated
     per beam; draft tokens held apart (``getDraftTokens()``), not passed.
[A1] ``tensorrt_llm/executor/base_worker.py`` ``BaseWorker._enqueue_request``: PyTorch
     ``py_logits_post_processors = lp if isinstance(lp, list) else [lp]``; TensorRT
     ``tllm.Request(logits_post_processor=<one callable>, logits_post_processor_name=
     BATCHED_POST_PROCESSOR_NAME`` when ``apply_batched_logits_processor``, ``client_id=request.id)``.
[A2] ``tensorrt_llm/executor/ipc.py`` ``ZeroMqQueue._prepare_data`` / ``_parse_data`` @
     0c8de69a1ca6213eebb20a51873890ff128666c2: requests reach the executor pickled (HMAC, then
     ``pickle.loads``).
[A3] ``tensorrt_llm/executor/executor.py`` ``GenerationExecutor.create`` @
     005bc848893f575ec14b45d6b13139360d67c790: ``batched_logits_processor`` travels pickled to the
     executor worker; ``submit()`` assigns ``request.set_id(self._get_next_client_id())`` inside
     ``generate_async``.
[A4] ``tensorrt_llm/llmapi/llm.py`` ``_prepare_sampling_params``: ``sampling_params._setup(...)``
     fills ``end_id`` in place when it is ``None``.

Both harnesses raise ``EngineFailure`` when a processor raises: TensorRT-LLM fails every active request."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["EngineFailure", "PytorchBackendHarness", "SamplingParamsStandIn", "TrtBackendHarness"]


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


class _Unreadable:
    """What a different engine version might hand over instead of a token list: no length, no items."""


@dataclass
class _Request:
    req_id: int
    prompt: list[int]
    processors: list[Any]
    beams: list[list[int]]
    client_id: int | None = None
    batched: bool = False
    draft_len: int = 0
    in_context: bool = True
    unreadable: bool = False

    def tokens(self, beams: int) -> list[Any]:
        """``getTokens()`` [T3] / ``get_tokens(beam)`` [P1]: prompt + generated per beam."""
        if self.unreadable:
            return [_Unreadable() for _ in range(beams)]
        return [self.prompt + generated for generated in self.beams[:beams]]


@dataclass
class _Harness:
    requests: dict[int, _Request] = field(default_factory=dict)

    def _enter(self, req_id: int, prompt: Sequence[int], processors: list[Any], beam_width: int,
               generated: Sequence[Sequence[int]] | None, **extra: Any) -> _Request:
        beams = [list(g) for g in generated] if generated else [[] for _ in range(beam_width)]
        request = _Request(req_id, list(prompt), processors, beams, in_context=not generated, **extra)
        self.requests[req_id] = request
        return request

    def commit(self, req_id: int, tokens: Sequence[int]) -> None:
        """The tokens sampled for each beam of ``req_id`` in the last step."""
        request = self.requests[req_id]
        for beam, token in zip(request.beams, tokens):
            beam.append(int(token))
        request.in_context = False

    def remove(self, req_id: int) -> None:
        self.requests.pop(req_id, None)

    def break_reads(self, req_id: int) -> None:
        """From now on ``req_id``'s ``token_ids`` are objects the adapter cannot read."""
        self.requests[req_id].unreadable = True

    def _inputs(self, inputs: Mapping[int, torch.Tensor], rows: int, req_id: int) -> torch.Tensor:
        x = inputs[req_id]
        return x.expand(rows, -1).clone() if x.ndim == 1 else x.clone()


class PytorchBackendHarness(_Harness):
    """The PyTorch backend [P1]: each request's processors, pickled across the process boundary
    [A2] and attached as ``py_logits_post_processors`` [A1]; ``add_sample`` models ``n > 1`` [P2]."""

    def add(self, req_id: int, prompt: Sequence[int], sampling_params: Any, *, beam_width: int = 1,
            generated: Sequence[Sequence[int]] | None = None) -> None:
        """A request arrives (``generated``: tokens per beam it carries, as a generation-only request
        on a disaggregated decode worker; it then starts in the generation phase)."""
        params = pickle.loads(pickle.dumps(sampling_params))  # [A2]
        lp = params.logits_processor
        self._enter(req_id, prompt, lp if isinstance(lp, list) else ([] if lp is None else [lp]), beam_width, generated)

    def add_sample(self, req_id: int, parent: int) -> None:
        """Another sample of ``parent`` (``n > 1``): a child request with deep copies of its processors [P2]."""
        source = self.requests[parent]
        self._enter(req_id, source.prompt, copy.deepcopy(source.processors), len(source.beams), None)

    def rows_of(self, req_id: int) -> int:
        request = self.requests[req_id]
        return 1 if request.in_context else len(request.beams)

    def step(self, inputs: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """One forward: ``inputs[req_id]`` is that request's ``[rows_of, vocab]`` model output (a
        ``[vocab]`` row is repeated); returns each request's rows after its processors ran."""
        order = sorted(inputs, key=lambda r: not self.requests[r].in_context)  # context requests first [P1]
        logits = torch.cat([self._inputs(inputs, self.rows_of(r), r) for r in order])
        offset, spans = 0, {}
        for req_id in order:
            request, width = self.requests[req_id], self.rows_of(req_id)
            spans[req_id] = (offset, width)
            tokens = request.tokens(width)
            skipped = request.in_context and not request.unreadable and len(request.prompt) < len(tokens[0])
            if request.processors and not skipped:
                view = logits[offset:offset + width].view(width, 1, -1)
                for lp in request.processors:
                    try:
                        assert 4 <= len(inspect.signature(lp).parameters) <= 5, "LogitsProcessor signature"
                        lp(req_id, view, tokens, None, None)
                    except Exception as exc:
                        raise EngineFailure(f"processor of request {req_id} raised; every active request fails: "
                                            f"{exc!r}") from exc
            offset += width
        return {r: logits[start:start + width] for r, (start, width) in spans.items()}


class TrtBackendHarness(_Harness):
    """The TensorRT (C++) backend [T1][T2][T3]. ``batched``: the engine's one batched processor.
    ``llm_api``: requests arrive through the LLM API (pickled [A2], client ids assigned at submit
    [A3], the batched processor handed to the executor worker pickled [A3]); otherwise the caller
    drives the executor API in this process and gives the client ids. ``stream_ptr``: what [T1]
    passes as the stream the decoder logits live on (an int; the CPU tensors here ignore it)."""

    def __init__(self, batched: Any = None, *, llm_api: bool = True, stream_ptr: int = 0) -> None:
        super().__init__()
        if batched is not None and llm_api:
            batched = pickle.loads(pickle.dumps(batched))  # [A3]
        self.batched = batched
        self.llm_api = llm_api
        self.stream_ptr = stream_ptr
        self._last_client_id = 1

    def add(self, req_id: int, prompt: Sequence[int], sampling_params: Any, *, beam_width: int = 1,
            generated: Sequence[Sequence[int]] | None = None, draft_len: int = 0,
            client_id: int | None = None) -> int | None:
        """A request arrives; returns its client id. ``draft_len``: draft tokens per generation step."""
        if draft_len and beam_width > 1:
            raise ValueError("TLLM_CHECK(draftLength == 0 || reqBeamWidth == 1)")  # [T2]
        if self.llm_api:
            sampling_params = pickle.loads(pickle.dumps(sampling_params))  # [A2]
            self._last_client_id += 1
            client_id = self._last_client_id  # [A3]
        lp = sampling_params.logits_processor
        if isinstance(lp, list):
            raise TypeError("the TensorRT backend's Request binding takes one logits_post_processor, not a list")  # [A1]
        self._enter(req_id, prompt, [] if lp is None else [lp], beam_width, generated, client_id=client_id,
                    batched=bool(sampling_params.apply_batched_logits_processor), draft_len=draft_len)
        return client_id

    def rows_of(self, req_id: int) -> int:
        """Rows of the model output the request contributes: ``draft + beam`` [T2]."""
        request = self.requests[req_id]
        return 1 if request.in_context else request.draft_len + len(request.beams)

    def _decoder_logits(self, request: _Request, rows: torch.Tensor) -> torch.Tensor:
        beams = len(request.beams)
        if beams > 1:  # [1, beam, vocab]: tiled at the context step, a view of the beam rows after [T2]
            return (rows.expand(beams, -1).clone() if request.in_context else rows).unsqueeze(0)
        return rows.view(rows.shape[0], 1, -1)  # [1 + draft, 1, vocab] [T2]

    def step(self, inputs: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """One step: ``inputs[req_id]`` is that request's ``[rows_of, vocab]`` model output (a
        ``[vocab]`` row is repeated); returns each request's decoder logits after processing."""
        order = sorted(inputs, key=lambda r: not self.requests[r].in_context)
        out: dict[int, torch.Tensor] = {}
        batch: list[_Request] = []
        for req_id in order:
            request = self.requests[req_id]
            out[req_id] = self._decoder_logits(request, self._inputs(inputs, self.rows_of(req_id), req_id))
            tokens = request.tokens(len(request.beams))
            if request.processors:  # its own processor, else the batched one, never both [T1]
                try:
                    request.processors[0](req_id, out[req_id], tokens, self.stream_ptr, request.client_id)
                except Exception as exc:
                    raise EngineFailure(f"processor of request {req_id} raised; every active request fails: "
                                        f"{exc!r}") from exc
            elif request.batched:
                batch.append(request)
        if batch:
            if self.batched is None:
                raise EngineFailure("requests opted into the batched processor, but the engine has none")
            try:
                self.batched([r.req_id for r in batch], [out[r.req_id] for r in batch],
                             [r.tokens(len(r.beams)) for r in batch], self.stream_ptr, [r.client_id for r in batch])
            except Exception as exc:
                raise EngineFailure(f"batched processor raised; every active request fails: {exc!r}") from exc
        return out
