"""A model of vLLM's Model Runner V2 sampler (test helpers shipped with the adapter, not vLLM).

``V2SamplerHarness`` drives a V2 ``LogitsProcessor`` with vLLM's real ``LogitsProcRequestState`` and
``LogitsContext``, as the V2 runner and ``Sampler`` do: slots from a free list (last freed, first
reused); ``add_request(slot, params)`` after the request's tokens are staged, not yet written
(``GPUModelRunner.add_requests``: ``RequestState.add_request``, the sampler's ``add_request``, then
``apply_staged_writes``), removal without telling processors; per step the runner's layout
(``idx_mapping``, ``expanded_idx_mapping``, ``expanded_local_pos``, ``input_ids`` with the last
committed token then the drafts, ``pos``), ``apply_staged_writes()`` once before the forward, no
call when no request needs processing, then ``apply(logits, ctx)`` on a fresh float32 copy
(``Sampler.apply_sampling_params``). Plain tensors (``HostBuffer``) stand in for the runner's
pinned ``StagedWriteTensor``/``UvaBackedTensor``: V2 needs Triton and an accelerator to start.

``RAISE_AFTER_FACTORY``: the kit's fault factory (``dynlogits.testing.faults``), re-exported."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dynlogits.testing.faults import RAISE_AFTER_FACTORY

from .v2 import HAS_V2_INTERFACE, LogitsContext, LogitsProcRequestState

__all__ = ["RAISE_AFTER_FACTORY", "HostBuffer", "StagedHostBuffer", "V2SamplerHarness", "adapter_failures", "adapter_realizations"]


def _adapters(worker: Any) -> list[Any]:
    """The adapter instances in a vLLM worker's sampler, on either model runner."""
    from .processor import DynamoVllmLogitsProcessor

    runner = worker.model_runner
    candidates: list[Any] = []
    batch = getattr(runner, "input_batch", None)
    if batch is not None:  # V1 runner
        candidates += [*batch.logitsprocs.non_argmax_invariant, *batch.logitsprocs.argmax_invariant]
    sampler = getattr(runner, "sampler", None)  # Model Runner V2
    candidates += list(getattr(sampler, "logits_processors", ()))
    return [p for p in candidates if isinstance(p, DynamoVllmLogitsProcessor)]


def adapter_failures(worker: Any) -> list[str]:
    """Run inside a vLLM worker (``LLM.collective_rpc(adapter_failures)``): the failure records
    of the adapter instances in that worker's sampler, on either model runner."""
    return [msg for p in _adapters(worker) for msg in p.failures]


def adapter_realizations(worker: Any) -> int:
    """Run inside a vLLM worker: how many payloads its adapter instances have realized."""
    return sum(p.realized for p in _adapters(worker))


class HostBuffer:
    """Stands in for vLLM's ``StagedWriteTensor``/``UvaBackedTensor`` on a CPU-only machine:
    ``.gpu`` is the device view, ``.np``/``.cpu`` the host view (the same memory here)."""

    def __init__(self, size: int | tuple[int, ...], dtype: torch.dtype = torch.int32,
                 to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.cpu = torch.zeros(size, dtype=dtype)
        self.gpu = self.cpu if to_device is None else to_device(self.cpu)  # same memory
        self.np = self.cpu.numpy()


class StagedHostBuffer(HostBuffer):
    """``HostBuffer`` with vLLM's ``StagedWriteTensor`` staging: ``stage_write(row, start, values)``
    keeps the write in the same host lists (``_staged_write_indices/_starts/_contents/_cu_lens``)
    until ``apply_write()`` puts it in the buffer."""

    def __init__(self, size: int | tuple[int, ...], dtype: torch.dtype = torch.int32,
                 to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__(size, dtype, to_device)
        self._staged_write_indices: list[int] = []
        self._staged_write_starts: list[int] = []
        self._staged_write_contents: list[int] = []
        self._staged_write_cu_lens: list[int] = []

    def stage_write(self, index: int, start: int, values: Sequence[int]) -> None:
        if not values:
            return
        self._staged_write_indices.append(index)
        self._staged_write_starts.append(start)
        self._staged_write_contents.extend(values)
        self._staged_write_cu_lens.append(len(self._staged_write_contents))

    def apply_write(self) -> None:
        begin = 0
        for index, start, end in zip(self._staged_write_indices, self._staged_write_starts, self._staged_write_cu_lens):
            values = self._staged_write_contents[begin:end]
            self.cpu[index, start : start + len(values)] = torch.tensor(values, dtype=self.cpu.dtype)
            begin = end
        for staged in (self._staged_write_indices, self._staged_write_starts, self._staged_write_contents,
                       self._staged_write_cu_lens):
            staged.clear()


@dataclass
class _Req:
    slot: int
    prompt_len: int
    total_len: int


class V2SamplerHarness:
    """Drives one V2 processor class through add/step/commit like the V2 runner (see module doc)."""

    def __init__(self, processor_cls: type, *, vocab_size: int, max_num_reqs: int = 8, max_model_len: int = 128,
                 vllm_config: Any = None, device: torch.device | str = "cpu",
                 to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """``device``/``to_device``: the device the runner's buffers live on and how a host tensor
        becomes a device view of the same memory (``dynlogits.testing.cuda.simcuda``'s model; default: CPU)."""
        if not HAS_V2_INTERFACE:
            raise RuntimeError("the installed vLLM has no Model Runner V2 logits-processor interface")
        self.vocab_size = vocab_size
        self.max_num_reqs = max_num_reqs
        self.free_slots = list(range(max_num_reqs))
        self.reqs: dict[str, _Req] = {}
        self.to_device = to_device or (lambda t: t)
        self.all_token_ids = StagedHostBuffer((max_num_reqs, max_model_len), to_device=to_device)
        self.prompt_len = HostBuffer(max_num_reqs, to_device=to_device)
        self.prefill_len = HostBuffer(max_num_reqs, to_device=to_device)
        self.total_len = HostBuffer(max_num_reqs, to_device=to_device)
        self.req_states = LogitsProcRequestState(
            device=torch.device(device),
            max_num_reqs=max_num_reqs,
            vocab_size=vocab_size,
            all_token_ids=self.all_token_ids,  # type: ignore[arg-type]  # the harness's host buffers stand in for vLLM's
            prompt_len=self.prompt_len,  # type: ignore[arg-type]  # the harness's host buffers stand in for vLLM's
            prefill_len=self.prefill_len,  # type: ignore[arg-type]  # the harness's host buffers stand in for vLLM's
            total_len=self.total_len,  # type: ignore[arg-type]  # the harness's host buffers stand in for vLLM's
        )
        self.processor = processor_cls(vllm_config, self.req_states)
        self.needs_processing = np.zeros(max_num_reqs, dtype=bool)

    # -- request lifecycle (GPUModelRunner.add_requests / _remove_request) --------------------
    def add_request(self, req_id: str, prompt_ids: Sequence[int], params: Any, output_ids: Sequence[int] = ()) -> int:
        """Admit (or resume, with ``output_ids``) a request; returns its slot."""
        type(self.processor).validate_params(params)
        slot = self.free_slots.pop()
        tokens = [*prompt_ids, *output_ids]
        self.all_token_ids.stage_write(slot, 0, tokens)  # the previous occupant's tokens stay until applied
        self.prompt_len.np[slot] = len(prompt_ids)
        self.prefill_len.np[slot] = len(tokens)
        self.total_len.np[slot] = len(tokens)
        self.reqs[req_id] = _Req(slot, len(prompt_ids), len(tokens))
        self.needs_processing[slot] = self.processor.add_request(slot, params)
        self.all_token_ids.apply_write()  # RequestState.apply_staged_writes, after the new requests
        return slot

    def remove_request(self, req_id: str) -> None:
        self.free_slots.append(self.reqs.pop(req_id).slot)

    def output_ids(self, req_id: str) -> list[int]:
        r = self.reqs[req_id]
        return self.all_token_ids.cpu[r.slot, r.prompt_len : r.total_len].tolist()

    def commit(self, req_id: str, token_ids: Sequence[int]) -> None:
        """Append accepted tokens, as the runner does after sampling/rejection."""
        r = self.reqs[req_id]
        self.all_token_ids.cpu[r.slot, r.total_len : r.total_len + len(token_ids)] = torch.tensor(
            list(token_ids), dtype=torch.int32
        )
        r.total_len += len(token_ids)
        self.total_len.np[r.slot] = r.total_len

    # -- one sampler step (Sampler.apply_sampling_params) -------------------------------------
    def context(self, batch: Sequence[str], drafts: Mapping[str, Sequence[int]],
                chunks: Mapping[str, int] | None = None) -> LogitsContext:
        """``chunks[req]``: the request is still in prefill and this step's chunk ends after that many
        tokens; its one row is at the chunk's last token (vLLM 0.32 ``vllm/v1/worker/gpu/input_batch.py``,
        ``_combine_sampled_and_draft_tokens_kernel``: every request of the step has logits rows, a
        prefill chunk's at its last token, whose sampled token the runner discards)."""
        slots, expanded, local, input_ids, pos = [], [], [], [], []
        for req_id in batch:
            r = self.reqs[req_id]
            slots.append(r.slot)
            end = (chunks or {}).get(req_id, r.total_len)
            last = int(self.all_token_ids.cpu[r.slot, end - 1])
            fed = [last, *drafts.get(req_id, ())]
            for k, token in enumerate(fed):
                expanded.append(r.slot)
                local.append(k)
                input_ids.append(token)
                pos.append(end - 1 + k)
        idx_np = np.asarray(slots, dtype=np.int32)
        dev = self.to_device
        return LogitsContext(
            expanded_idx_mapping=dev(torch.tensor(expanded, dtype=torch.int32)),
            idx_mapping=dev(torch.from_numpy(idx_np.copy())),
            idx_mapping_np=idx_np,
            expanded_local_pos=dev(torch.tensor(local, dtype=torch.int32)),
            input_ids=dev(torch.tensor(input_ids, dtype=torch.int32)),
            pos=dev(torch.tensor(pos, dtype=torch.int64)),
            seq_lens_upper_bound_np=np.asarray([self.reqs[q].total_len + len(drafts.get(q, ())) for q in batch]),
        )

    def step(self, batch: Sequence[str], logits: torch.Tensor, drafts: Mapping[str, Sequence[int]] | None = None,
             chunks: Mapping[str, int] | None = None) -> torch.Tensor:
        """Process one step's logits (one row per request, plus one per draft token, in ``batch`` order;
        ``chunks``: requests still in prefill, see ``context``)."""
        self.processor.apply_staged_writes()  # the runner flushes staged writes once per step, before the forward
        ctx = self.context(batch, drafts or {}, chunks)
        if logits.shape[0] != ctx.expanded_idx_mapping.shape[0]:
            raise ValueError(f"expected {ctx.expanded_idx_mapping.shape[0]} logits rows, got {logits.shape[0]}")
        if not np.any(self.needs_processing[ctx.idx_mapping_np]):
            return logits
        logits = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
        return self.processor.apply(logits, ctx)

    def greedy_step(self, batch: Sequence[str], *, seed: int = 0) -> dict[str, int]:
        """Random logits, processed, argmax per request, committed; returns the sampled tokens."""
        gen = torch.Generator().manual_seed(seed)
        logits = self.step(batch, torch.randn(len(batch), self.vocab_size, generator=gen))
        sampled = {req_id: int(logits[i].argmax()) for i, req_id in enumerate(batch)}
        for req_id, token in sampled.items():
            self.commit(req_id, [token])
        return sampled
