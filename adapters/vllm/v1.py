"""The V1 model runner half of the adapter (``vllm.v1.sample.logits_processor``).

The V1 runner keeps a persistent batch and reports changes as ``BatchUpdate``s (added, removed,
moved: the order of vLLM's ``process_dict_updates``); each add brings a live reference to the
request's output list. Entries with a template (every built-in kind, and a plug-in's that has one)
are resident in a ``dynlogits.sdk.SlotBatch`` (positions from the live lists' lengths, uploaded
without blocking); the others go through ``dynlogits.sdk.apply_rows`` with their histories, after
the resident ones (``GuardedRequest.split``: which entries of a request that holds both run where).

Guarantees: a request removed and re-added (preemption, a step without it) reuses its realized
processors (``RealizedRequests``), so a ``python`` factory is imported once and a failure is kept.
Under async scheduling a history's last token is a ``-1`` placeholder unless the class was passed
in ``logits_processors=``; positions are right either way, and a token-reading processor that meets
a placeholder is logged once with that fix."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor, BatchUpdate, MoveDirectionality

from dynlogits.sdk import GuardedRequest, SlotBatch, apply_rows, drain
from dynlogits.sdk.resident.engine_step import EngineStep

__all__ = ["RealizedRequests", "V1RunnerMixin"]

logger = logging.getLogger("dynlogits.adapters.vllm")

PLACEHOLDER = -1


@dataclass
class _Entry:
    request: GuardedRequest
    output_ids: list[int]  # vLLM's live list: grows as the request generates
    slot: int | None  # its SlotBatch slot when (some of it is) resident
    hosted: GuardedRequest | None = None  # what of it runs per row (``GuardedRequest.split``)


class RealizedRequests:
    """Each request's realized processors, kept while vLLM keeps the request.

    Keyed by the identities of the request's ``SamplingParams`` and live output list (``n > 1``
    children may share the params); an entry holds the list, so its identity is not reused while the
    entry lives, and goes when the params are garbage collected."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], tuple[list[int], GuardedRequest | None]] = {}

    def get(self, params: Any, output_ids: list[int], realize: Callable[[], GuardedRequest | None]) -> GuardedRequest | None:
        key = (id(params), id(output_ids))
        hit = self._held.get(key)
        if hit is not None and hit[0] is output_ids:
            return hit[1]
        request = realize()
        try:
            weakref.finalize(params, self._held.pop, key, None)
        except TypeError:  # an object without weak references: realize on every add
            return request
        self._held[key] = (output_ids, request)
        return request

    def __len__(self) -> int:
        return len(self._held)


def _reads_tokens(request: GuardedRequest) -> bool:
    """Whether a resident request's kinds read the tokens themselves (not only their count)."""
    return request.processor is not None and any(
        getattr(getattr(p, "template", None), "reads_tokens", False) for p in request.processor.processors)


class V1RunnerMixin(AdapterLogitsProcessor):
    """V1-runner behaviour; the public class combines it with the V2 half (see ``processor``)."""

    vocab_size: int
    new_req_logits_processor: Any  # shared realization, defined by the public class

    def _init_v1_state(self, vllm_config: Any, device: torch.device) -> None:
        num_slots = int(vllm_config.scheduler_config.max_num_seqs)
        self._entries: dict[int, _Entry] = {}  # persistent-batch index -> request
        self._resident = SlotBatch(num_slots=num_slots, vocab_size=self.vocab_size, device=device,
                                   host_histories=True)  # every step passes the live lists
        self._free_slots = list(range(num_slots - 1, -1, -1))
        self._realized = RealizedRequests()
        self._row_histories: list[list[int]] = []
        #: the resident step's input, made once per layout: it holds ``_row_histories``, the lists vLLM grows
        self._step = EngineStep(histories=self._row_histories)
        self._hosted_rows: list[int] = []
        self._any_resident = False
        self._reads_tokens: list[int] = []
        self._warned_placeholder = False
        self._placeholder_turn = 0  # which of _reads_tokens the next step checks

    def is_argmax_invariant(self) -> bool:
        """Forcing, banning and biasing all change the argmax, so greedy requests need us too."""
        return False

    # -- batch bookkeeping -----------------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
        if not batch_update:
            return
        for index, params, prompt, output_ids in batch_update.added:
            self._drop(index)
            request = self._realized.get(params, output_ids,
                                         partial(self.new_req_logits_processor, params, prompt, output_ids))
            if request is None:
                continue
            slot = None
            resident, hosted = request.split() if self._free_slots else (None, request)
            if resident is not None:
                slot = self._free_slots.pop()
                self._resident.assign(slot, resident)
            self._entries[index] = _Entry(request, output_ids, slot, hosted)
        for index in batch_update.removed:
            self._drop(index)
        for a, b, direction in batch_update.moved:
            entry_a, entry_b = self._entries.pop(a, None), self._entries.pop(b, None)
            if entry_a is not None:
                self._entries[b] = entry_a
            if entry_b is not None and direction == MoveDirectionality.SWAP:
                self._entries[a] = entry_b
            elif entry_b is not None:  # overwritten by a one-way move: vLLM dropped it
                self._release(entry_b)
        self._relayout(batch_update.batch_size)

    def _drop(self, index: int) -> None:
        entry = self._entries.pop(index, None)
        if entry is not None:
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        if entry.slot is not None:
            self._resident.assign(entry.slot, None)
            self._free_slots.append(entry.slot)
            entry.slot = None

    def _relayout(self, batch_size: int) -> None:
        size = max(batch_size, max(self._entries, default=-1) + 1)
        host_slots = np.full(size, -1, dtype=np.int64)
        histories: list[list[int]] = [[] for _ in range(size)]
        hosted = []
        for index, entry in self._entries.items():
            histories[index] = entry.output_ids
            if entry.hosted is not None:
                hosted.append(index)
            if entry.slot is not None:
                host_slots[index] = entry.slot
        self._row_histories = histories
        self._step = EngineStep(histories=histories)
        self._hosted_rows = sorted(hosted)
        self._reads_tokens = [i for i, e in self._entries.items() if e.hosted is not None or _reads_tokens(e.request)]
        self._any_resident = bool((host_slots >= 0).any())
        self._resident.set_rows(host_slots)
        self._resident.flush()

    # -- one step ------------------------------------------------------------------------------
    def _apply_v1(self, logits: torch.Tensor) -> torch.Tensor:
        drain()
        if not self._entries:
            return logits
        if self._reads_tokens and not self._warned_placeholder:
            self._check_placeholder()
        if self._any_resident:
            try:
                self._resident.apply(logits, self._step)
            except Exception as exc:  # an adapter bug must not take the engine down: fail these requests
                self._fail_resident_v1(logits, exc)
        if self._hosted_rows:
            rows = self._hosted_rows
            histories = [self._entries[r].output_ids for r in rows]
            apply_rows(logits, rows, [self._entries[r].hosted for r in rows], histories)  # type: ignore[misc]  # hosted rows only
        return logits

    def _fail_resident_v1(self, logits: torch.Tensor, exc: Exception) -> None:
        logger.error("the resident apply path failed; failing its requests", exc_info=True)
        for index, entry in self._entries.items():
            if entry.slot is not None:
                entry.request.fail_with(exc, entry.output_ids)
                self._resident.mark_failed(entry.slot)
                entry.request.force_stop(logits[index])

    def _check_placeholder(self) -> None:
        """One row that reads tokens per step, in turn. Under async scheduling vLLM appends ``-1`` to
        every row it sampled (vllm 0.32.0, ``gpu_model_runner.py``, ``_bookkeeping_sync``) and puts
        the token in its place before the sampler only when output ids are needed
        (``gpu_input_batch.py``, ``InputBatch.update_async_output_token_ids``), so a row in turn
        finds it within a step or two, at a cost that does not grow with the batch."""
        rows = self._reads_tokens
        self._placeholder_turn = turn = (self._placeholder_turn + 1) % len(rows)
        history = self._row_histories[rows[turn]]
        if history and history[-1] == PLACEHOLDER:
            self._warned_placeholder = True
            logger.error(
                "a request history ends in the placeholder id -1 (async scheduling): vLLM repairs it before "
                "the sampler only when the adapter is passed in logits_processors=[...] / --logits-processors; "
                "install it that way, not through the entry-point group alone. Processors that read tokens "
                "see the placeholder until then."
            )

    def held_v1(self) -> int:
        """How many requests this instance holds state for (the persistent batch's)."""
        return len(self._entries)
