"""Conformance-kit drivers for the vLLM adapter: one per model runner; no model forward runs.

* ``vllm-v1``: ``DynamoVllmLogitsProcessor`` with a real ``VllmConfig`` of the embedded model, driven
  through vLLM's ``BatchUpdateBuilder`` as the V1 runner's ``InputBatch`` drives it (removals, slot
  reuse, condensing moves, swaps, live output lists).
* ``vllm-v2``: the same class on Model Runner V2's interface through ``harness.V2SamplerHarness``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
import vllm
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdateBuilder, MoveDirectionality

from dynlogits import sdk
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.sdk.activation import activate_logits_processors
from dynlogits.specs import WIRE_KEY, LogitsProcessorSpec

from .harness import V2SamplerHarness
from .processor import DynamoVllmLogitsProcessor

__all__ = ["VllmV1Driver", "VllmV2Driver", "drivers"]


@cache
def _vllm_config(vocab_size: int) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    from dynlogits.model_builder import default_model_dir

    config = EngineArgs(model=str(default_model_dir()), max_model_len=512, dtype="float32",
                        enforce_eager=True).create_engine_config()
    width = config.model_config.get_vocab_size()
    if width != vocab_size:
        raise ValueError(f"the embedded model's logits width is {width}; the vLLM drivers cannot serve vocab_size={vocab_size}")
    return config


def _carried(payload: Any) -> Any:
    """How ``extra_args`` carries the wire value ``payload``: a list as it is; text as JSON text, since
    the adapter parses text once (``request.carried_payload``) and the wire value must come out."""
    return json.dumps(payload) if isinstance(payload, str) else payload


def _params(payload: Any, eos_token_id: int, stop_token_ids: Sequence[int] = (),
            arrival_time: float | None = None) -> SamplingParams:
    extra = None if payload is None else {WIRE_KEY: _carried(payload)}
    if extra is not None:
        sdk.put_arrival(extra, arrival_time)  # where activate_logits_processors puts it
    params = SamplingParams(extra_args=extra, stop_token_ids=list(stop_token_ids))
    params.update_from_generation_config({}, eos_token_id)  # as the engine does from the model's config
    return params


class _Common:
    vocab_size: int
    #: what the kit's requests sample at (``SamplingParams``' default), for the oracle (``watermark``)
    temperature = 1.0
    processor: DynamoVllmLogitsProcessor

    def activate(self, spec: LogitsProcessorSpec | None, role: DisaggregationMode) -> Any | None:
        params = SamplingParams(extra_args={WIRE_KEY: [{"kind": "smuggled"}]})
        activate_logits_processors(params, sdk.gate(spec, role))
        return (params.extra_args or {}).get(WIRE_KEY)

    def admit(self, payload: Any) -> None:
        DynamoVllmLogitsProcessor.validate_params(SamplingParams(extra_args={WIRE_KEY: _carried(payload)}))

    def failures(self) -> list[str]:
        return list(self.processor.failures)


class VllmV1Driver(_Common):
    """The V1 runner's persistent batch, reproduced with vLLM's ``BatchUpdateBuilder``."""

    name = "vllm-v1"
    releases_on_finish = True

    def __init__(self, vocab_size: int) -> None:
        config = _vllm_config(vocab_size)
        self.vocab_size = vocab_size
        self.exercised = (f"vLLM {vllm.__version__}: real DynamoVllmLogitsProcessor (V1 AdapterLogitsProcessor) with a real "
                          "VllmConfig, BatchUpdateBuilder and process_dict_updates; no model forward")
        self.processor = DynamoVllmLogitsProcessor(config, torch.device("cpu"), False)
        self.builder = BatchUpdateBuilder()
        self.layout: list[str] = []  # persistent-batch index -> request id
        # request id -> (params, prompt, live output list); a request left out of a step's batch is
        # preempted (removed from the persistent batch) and re-added with the same live list
        self.requests: dict[str, tuple[SamplingParams, list[int], list[int]]] = {}

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        params = _params(payload, eos_token_id, stop_token_ids, arrival_time)
        self.requests[req_id] = (params, list(prompt_ids), list(output_ids))

    def _relayout(self, batch: Sequence[str]) -> None:
        b = self.builder
        holes = []
        for index, req in enumerate(self.layout):
            if req not in batch:
                b.removed_append(index)
                holes.append(index)
        layout: list[str | None] = [r if r in batch else None for r in self.layout]
        for req in batch:
            if req in layout:
                continue
            params, prompt, output = self.requests[req]
            removed = b.pop_removed()
            if removed is None:
                index = len(layout)
                layout.append(None)
            else:
                index = removed
            layout[index] = req
            b.added.append((index, params, prompt, output))
        while None in layout:  # condense: the last request moves into the lowest hole
            hole = layout.index(None)
            last = len(layout) - 1
            if last != hole and layout[last] is not None:
                b.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
                layout[hole] = layout[last]
            layout.pop()
        for i, req in enumerate(batch):  # order rows as asked
            j = layout.index(req)
            if j != i:
                b.moved.append((i, j, MoveDirectionality.SWAP))
                layout[i], layout[j] = layout[j], layout[i]
        self.layout = [r for r in layout if r is not None]
        self.processor.update_state(b.get_and_reset(len(self.layout)))

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        self._relayout(batch)
        return self.processor.apply(logits)

    def commit(self, req_id: str, token_id: int) -> None:
        self.requests[req_id][2].append(token_id)

    def remove(self, req_id: str) -> None:
        if req_id in self.layout:
            self._relayout([r for r in self.layout if r != req_id])
        del self.requests[req_id]

    def held_requests(self) -> int:
        return self.processor.held_requests()


class VllmV2Driver(_Common):
    """Model Runner V2's slots and per-step ``LogitsContext``, through ``V2SamplerHarness``."""

    name = "vllm-v2"
    releases_on_finish = False  # V2 recycles slots without a removal call

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.exercised = (f"vLLM {vllm.__version__}: real DynamoVllmLogitsProcessor on the Model Runner V2 interface with "
                          "real LogitsProcRequestState/LogitsContext; harness buffers stand in for the runner's "
                          "pinned-memory tensors (Model Runner V2 needs Triton and an accelerator)")
        config = _vllm_config(vocab_size)
        #: the most tokens (prompt and output) a request holds: the engine's (``max_model_len``)
        self.max_model_len = int(config.model_config.max_model_len)
        self.harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=vocab_size, max_num_reqs=8,
                                        max_model_len=self.max_model_len, vllm_config=config)
        self.processor = self.harness.processor
        self._held: dict[str, int] = {}  # tokens each request holds

    def _fits(self, req_id: str, tokens: int) -> None:
        """``ValueError`` naming the engine's limit when ``req_id`` would hold more than ``max_model_len``
        tokens (vLLM ends a request there: such a history never reaches a sampler)."""
        if tokens > self.max_model_len:
            raise ValueError(f"{self.name}: request {req_id!r} would hold {tokens} tokens (prompt and output); the "
                             f"engine's max_model_len is {self.max_model_len}, where vLLM ends a request")

    def add(self, req_id: str, payload: Any, *, prompt_ids: Sequence[int], output_ids: Sequence[int] = (),
            eos_token_id: int, stop_token_ids: Sequence[int] = (), arrival_time: float | None = None) -> None:
        self._fits(req_id, len(prompt_ids) + len(output_ids))
        params = _params(payload, eos_token_id, stop_token_ids, arrival_time)
        self.harness.add_request(req_id, prompt_ids, params, output_ids=output_ids)
        self._held[req_id] = len(prompt_ids) + len(output_ids)

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        return self.harness.step(batch, logits)

    def commit(self, req_id: str, token_id: int) -> None:
        self._fits(req_id, self._held.get(req_id, 0) + 1)
        self.harness.commit(req_id, [token_id])
        self._held[req_id] = self._held.get(req_id, 0) + 1

    def remove(self, req_id: str) -> None:
        self.harness.remove_request(req_id)
        self._held.pop(req_id, None)

    def held_requests(self) -> int:
        return self.processor.held_requests()


def drivers(vocab_size: int) -> list[VllmV1Driver | VllmV2Driver]:
    """Fresh drivers for both model runners (the kit's factory)."""
    return [VllmV1Driver(vocab_size), VllmV2Driver(vocab_size)]
