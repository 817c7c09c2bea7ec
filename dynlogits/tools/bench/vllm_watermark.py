"""vLLM 0.32's own watermarker, called as its Model Runner V2 sampler calls it (``vllm_watermark`` in
the micro suite): the figure the ``watermark`` workload's adapter is set beside.

vLLM draws a watermarked token in ``GPUWatermarkSampler._sample_random``
(``vllm/v1/watermarking/gpu_sampler.py``), after ``Sampler.apply_sampling_params`` has divided the
logits by the temperature (``SamplingStates.apply_temperature``, which skips the kernel when every
row's temperature is 0 or 1). One step, for the whole batch, timed here:

1. ``SamplingStates.apply_temperature``'s rule: divide the rows by their temperatures unless every
   one is 0 or 1 (the workload samples at 1.0: no division, as in vLLM);
2. ``GPUWatermarkSampler._get_contexts``, vLLM's own method, called on a stand-in ``self`` that holds
   the runner's state it reads (``req_states.all_token_ids`` / ``total_len`` / ``prompt_len``, kept
   by ``advance`` outside the timing, as vLLM's request state is kept by the runner): the contexts
   tensor, ``-1`` before the output;
3. ``GumbelWatermarker(key, context_width, prf="philox").sample(logits, contexts)``: on a CPU tensor
   its Philox PRF over every (row, id) and the argmax of ``logits + Gumbel noise``, one call.

Left out: the repeated-context mask (``deduplicate_contexts``) and the mixed path it switches on
(``skip_mask`` with the ordinary sampler for repeated rows): the workload's contexts never repeat,
so the mask is all false, and vLLM's CPU version of it is a per-row Python reference of its Triton
kernel (``_repeated_context_mask_cpu``), not what a deployment runs; and the ``torch.where`` that
puts greedy rows' argmax back (no row of the workload is greedy). The adapter's own deduplication
(its history of contexts, on the host) is in its timed step: leaving vLLM's out favours vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

__all__ = ["NativeWatermarker"]


class NativeWatermarker:
    """vLLM's watermark draw for ``len(prompts)`` requests of one batch, one request per row."""

    def __init__(self, key: int, context_width: int, *, prompts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]], temperatures: Sequence[float], max_model_len: int) -> None:
        from vllm.v1.watermarking.gpu_sampler import GPUWatermarkSampler
        from vllm.v1.watermarking.gumbel import GumbelWatermarker

        rows = len(prompts)
        self.watermarker = GumbelWatermarker(key, context_width=context_width, prf="philox")
        self._get_contexts = GPUWatermarkSampler._get_contexts
        all_token_ids = torch.zeros(rows, max_model_len, dtype=torch.int32)
        total_len = torch.zeros(rows, dtype=torch.int32)
        prompt_len = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
        for r, (prompt, output) in enumerate(zip(prompts, outputs)):
            tokens = [*prompt, *output]
            all_token_ids[r, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            total_len[r] = len(tokens)
        # the runner's state that _get_contexts reads (``.gpu``: the runner's device copies)
        self._sampler = SimpleNamespace(
            watermarker=self.watermarker,
            req_states=SimpleNamespace(all_token_ids=SimpleNamespace(gpu=all_token_ids),
                                       total_len=SimpleNamespace(gpu=total_len),
                                       prompt_len=SimpleNamespace(gpu=prompt_len)))
        self.temperature_np = np.asarray(temperatures, dtype=np.float32)
        self.temperature = torch.from_numpy(self.temperature_np.copy())
        self.idx_mapping = torch.arange(rows, dtype=torch.int32)
        self.idx_mapping_np = np.arange(rows)
        self.tokens: torch.Tensor | None = None

    def advance(self, tokens: Sequence[int]) -> None:
        """The step's new tokens join the runner's state (untimed: the runner keeps it)."""
        state: Any = self._sampler.req_states
        for r, token in enumerate(tokens):
            at = int(state.total_len.gpu[r])
            state.all_token_ids.gpu[r, at] = token
            state.total_len.gpu[r] = at + 1

    def step(self, logits: torch.Tensor) -> None:
        """One watermarked draw for every row: the sampled ids land in ``tokens``."""
        temps = self.temperature_np[self.idx_mapping_np]
        if not np.all((temps == 0.0) | (temps == 1.0)):  # SamplingStates.apply_temperature
            logits.div_(self.temperature[self.idx_mapping].unsqueeze(-1))
        # vLLM's own method, its ``self`` a stand-in holding the state it reads
        contexts = self._get_contexts(self._sampler, self.idx_mapping)  # type: ignore[arg-type]  # a stand-in self
        self.tokens = self.watermarker.sample(logits, contexts).token_ids
