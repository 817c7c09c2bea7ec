"""The Model Runner V2 half of the adapter (``vllm.v1.worker.gpu.sample.logits_processor``, vLLM >= 0.31).

Slots are recycled without a removal call, so ``add_request(slot, params)`` overwrites the slot's
state and returns whether the request needs us; staged writes reach the device in
``apply_staged_writes`` (once per step, before the forward). ``apply(logits, ctx)`` runs once per
step; ``ctx.expanded_idx_mapping`` maps rows to slots, and under speculative decoding a request has
one row per draft token (``ctx.expanded_local_pos``: ``k`` after ``k`` drafts).

Built-in kinds are resident in a ``dynlogits.sdk.SlotBatch`` keyed by the runner's slot, positions
from the device (``ctx.pos + 1 - prompt_len[slot]``), ``thinking_budget`` followed on the device,
``banned_phrases`` matched against each row's last tokens on the device (``TokenWindow`` over
``all_token_ids``, ``ctx.pos`` and the drafts in ``ctx.input_ids``); no step reads back. ``python``
and plug-in entries without a template are hosted, after the resident entries of their request
(``GuardedRequest.split``): their histories are read back (``row_histories``) only when one is in
the step. Draft rows of a request still in prefill are left
untouched; a failure on a draft row stops that row only, on the committed row the request."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from dynlogits.sdk import DeviceThinking, GuardedRequest, SlotBatch, TokenWindow, apply_draft_row, apply_rows, drain
from dynlogits.sdk.resident.engine_step import EngineStep

from .request import read_payload

try:  # vLLM >= 0.31; the adapter still works with the V1 runner alone on older versions
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

    HAS_V2_INTERFACE = True
except ImportError:  # pragma: no cover - depends on the installed vLLM
    HAS_V2_INTERFACE = False
    LogitsProcessor = object  # type: ignore[assignment,misc]  # a stand-in base where V2 is absent
    LogitsContext = LogitsProcRequestState = None  # type: ignore[assignment,misc]  # only named, never used, there

__all__ = ["HAS_V2_INTERFACE", "PLACEHOLDER", "SeenSlots", "V2RunnerMixin", "row_histories", "staged_prompt"]

PLACEHOLDER = -1

logger = logging.getLogger("dynlogits.adapters.vllm")


def row_histories(
    req_states: Any, ctx: Any, rows: np.ndarray, slots: np.ndarray
) -> list[list[int] | None]:
    """The generated tokens visible to each of ``rows`` (slots ``slots``), read back from the device;
    ``None`` for a draft row whose drafts are placeholders. ``req_states``: a ``LogitsProcRequestState``
    (``all_token_ids.gpu``, ``total_len.gpu``, ``prompt_len.np``); only the generated columns of these
    slots are copied."""
    unique = np.unique(slots)
    index = torch.from_numpy(unique.astype(np.int64)).to(req_states.all_token_ids.gpu.device)
    total = req_states.total_len.gpu[index].cpu().numpy()
    prompt = np.asarray(req_states.prompt_len.np)[unique]
    low, high = int(prompt.min()), int(total.max())
    tokens = req_states.all_token_ids.gpu[index, low:high].cpu().numpy() if high > low else np.zeros((len(unique), 0), np.int64)
    committed = {int(s): tokens[i, prompt[i] - low : total[i] - low].tolist() for i, s in enumerate(unique)}

    one_row_per_request = ctx.expanded_idx_mapping.shape[0] == len(ctx.idx_mapping_np)
    if one_row_per_request:
        return [committed[int(s)] for s in slots]
    local = ctx.expanded_local_pos.cpu().numpy()
    inputs = ctx.input_ids.cpu().numpy()
    histories: list[list[int] | None] = []
    for row, slot in zip(rows.tolist(), slots.tolist()):
        k = int(local[row])
        drafts = inputs[row - k + 1 : row + 1].tolist() if k else []
        histories.append(None if PLACEHOLDER in drafts else committed[slot] + drafts)
    return histories


def staged_prompt(all_token_ids: Any, slot: int, prompt_len: int) -> list[int] | None:
    """The prompt of the request just added to ``slot``, from the runner's staged write of its tokens:
    ``RequestState.add_request`` stages them in ``all_token_ids`` (a ``StagedWriteTensor``: host lists
    ``_staged_write_indices/_starts/_contents/_cu_lens``) before the sampler's ``add_request``, and
    sends them only at ``apply_staged_writes``. A host read, no device read. ``None`` when no such
    write is staged (a runner that writes them otherwise)."""
    indices = getattr(all_token_ids, "_staged_write_indices", None)
    starts = getattr(all_token_ids, "_staged_write_starts", None)
    contents = getattr(all_token_ids, "_staged_write_contents", None)
    cu_lens = getattr(all_token_ids, "_staged_write_cu_lens", None)
    if indices is None or starts is None or contents is None or cu_lens is None:
        return None
    for i in range(len(indices) - 1, -1, -1):  # the last write to the slot is its occupant's
        if indices[i] == slot and starts[i] == 0:
            begin = cu_lens[i - 1] if i else 0
            return [int(t) for t in contents[begin : begin + prompt_len]] if cu_lens[i] - begin >= prompt_len else None
    return None


class SeenSlots:
    """A step's slots (``idx_mapping_np``, copied) and what they held then: whether any is active,
    which are resident and whether any is, whether any is hosted. ``holds(slots)``: whether a step's
    slots are these (same dtype and values: a byte compare, cheaper than ``np.array_equal``); what
    they hold is the adapter's to invalidate (``add_request`` drops it)."""

    __slots__ = ("_bytes", "any_active", "any_hosted", "any_resident", "resident", "slots")

    def __init__(self, slots: np.ndarray, any_active: bool, resident: np.ndarray, any_hosted: bool) -> None:
        self.slots = slots
        self._bytes = slots.tobytes()
        self.any_active = any_active
        self.resident = resident
        self.any_resident = bool(resident.any())
        self.any_hosted = any_hosted

    @classmethod
    def of(cls, slots_in_step: np.ndarray, active: np.ndarray, is_resident: np.ndarray,
           is_hosted: np.ndarray) -> SeenSlots:
        """What ``slots_in_step`` hold, from the per-slot flags ``active``, ``is_resident``, ``is_hosted``."""
        return cls(slots_in_step.copy(), bool(active[slots_in_step].any()), is_resident[slots_in_step],
                   bool(is_hosted[slots_in_step].any()))

    def holds(self, slots_in_step: np.ndarray) -> bool:
        return slots_in_step.dtype == self.slots.dtype and slots_in_step.tobytes() == self._bytes


class V2RunnerMixin(LogitsProcessor):
    """Model Runner V2 behaviour; the public class combines it with the V1 half (see ``processor``)."""

    vocab_size: int
    new_req_logits_processor: Any  # shared realization, defined by the public class
    engine_spec: Any  # the engine-side spec source, set by the public class

    def _init_v2_state(self, vllm_config: Any, req_states: Any) -> None:
        self._req_states = req_states
        slots = req_states.max_num_reqs
        self._slots: list[GuardedRequest | None] = [None] * slots
        self._active = np.zeros(slots, dtype=bool)
        self._is_resident = np.zeros(slots, dtype=bool)
        #: what of each slot's request runs per row (``GuardedRequest.split``), and whether any does
        self._hosted: list[GuardedRequest | None] = [None] * slots
        self._is_hosted = np.zeros(slots, dtype=bool)
        self._resident = SlotBatch(num_slots=slots, vocab_size=self.vocab_size, device=req_states.device,
                                   token_window=True)
        spec = getattr(vllm_config, "speculative_config", None)
        drafts = int(getattr(spec, "num_speculative_tokens", 0) or 0)
        self._window = TokenWindow(req_states.device)
        # tables as wide as the SlotBatch's (its sentinel row included); a step commits <= 1 + drafts tokens
        self._thinking = DeviceThinking(slots + 1, req_states.device, max_new=1 + drafts)
        #: a request's rows in a step: at most 1 + the configured drafts (vLLM proposes no more than
        #: ``num_speculative_tokens``); without a speculative config, bounded by the step's spare rows
        self._max_rows = 1 + drafts if drafts else None
        self._layout: np.ndarray | None = None  # idx_mapping_np of the last listed layout
        #: the last step's slots and what they hold: reused while the slots and their occupants stay
        self._seen: SeenSlots | None = None
        #: a listed step's engine input when no group is positional: the same objects every step
        self._listed_step = EngineStep(thinking=self._thinking.decide, window=self._window)
        self._prompt_offset: torch.Tensor | None = None  # prompt_len - 1 of the listed layout's rows
        self._warned_prompt = False

    def _prompt_of(self, slot: int) -> list[int] | None:
        """The prompt of ``slot``'s new occupant (``staged_prompt``); ``None``, logged once, where the
        runner staged no write of it: reasoning phases then start at the first generated token."""
        states = self._req_states
        prompt = staged_prompt(states.all_token_ids, slot, int(states.prompt_len.np[slot]))
        if prompt is None and not self._warned_prompt:
            self._warned_prompt = True
            logger.warning("Model Runner V2 staged no write of a new request's tokens: its prompt is unknown to the "
                           "logits processors, so a reasoning span its prompt opens is not seen, no_repeat_ngram's "
                           "include_prompt is refused and a hosted dry entry's window starts at the output "
                           "(docs/specs.md)")
        return prompt

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Reset slot ``req_idx`` for a new occupant; True when it carries a payload. Realization gets
        the request's prompt from the runner's staged writes (``staged_prompt``)."""
        drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
        carries = read_payload(sampling_params) is not None or self.engine_spec is not None
        request = self.new_req_logits_processor(sampling_params, self._prompt_of(req_idx) if carries else None)
        self._slots[req_idx] = request
        self._active[req_idx] = request is not None
        if request is not None and request.failed:  # refused at realization: only stopped, by the resident path
            resident, hosted = request, None
        else:
            resident, hosted = request.split() if request is not None else (None, None)
        self._is_resident[req_idx] = self._resident.assign(req_idx, resident)
        if not self._is_resident[req_idx]:
            hosted = request
        self._hosted[req_idx] = hosted
        self._is_hosted[req_idx] = hosted is not None
        # tokens it enters with (preempted and resumed), from the host mirrors: no read back
        resumed = max(0, int(self._req_states.prefill_len.np[req_idx]) - int(self._req_states.prompt_len.np[req_idx]))
        following = request is not None and self._is_resident[req_idx] and not request.failed
        self._thinking.assign(req_idx, resident if following else None, resumed=resumed)
        self._layout = self._seen = None  # the listed layout's slots may hold another occupant now
        return request is not None

    def apply_staged_writes(self) -> None:
        """Copy the slot tables staged by ``add_request`` to the device (once per step, before the forward)."""
        drain()
        self._resident.flush()
        self._thinking.flush()

    def _offset(self, ctx: Any, known: bool) -> torch.Tensor:
        """``prompt_len[slot] - 1`` per row: tokens generated before a row are ``ctx.pos - offset`` (negative
        in prefill). In a listed layout the same tensor is returned until the layout changes
        (``EngineStep.pos_offset``'s contract)."""
        if known and self._prompt_offset is not None:
            return self._prompt_offset
        prompt = self._req_states.prompt_len.gpu  # read each step: vLLM swaps the UVA buffer it points to
        offset = prompt[ctx.expanded_idx_mapping].to(ctx.pos.dtype) - 1
        if known:
            self._prompt_offset = offset
        return offset

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        drain()
        slots_in_step = ctx.idx_mapping_np
        seen = self._seen
        if seen is None or not seen.holds(slots_in_step):
            seen = self._seen = SeenSlots.of(slots_in_step, self._active, self._is_resident, self._is_hosted)
        if not seen.any_active:
            return logits  # no request of this step carries a payload: nothing at all to do
        if seen.any_resident:
            try:
                self._apply_resident(logits, ctx, slots_in_step, seen.resident)
            except Exception as exc:  # an adapter bug must not take the engine down: fail these requests
                self._fail_resident_v2(logits, slots_in_step, seen.resident, exc)
        if seen.any_hosted:  # an active request with entries that are not resident
            self._apply_hosted(logits, ctx)
        return logits

    def _rows_per_request(self, rows: int, requests: int) -> int:
        """The most rows one request has this step: every spare row could be one request's draft,
        but never more than the speculative config allows (each row a span-following round)."""
        spare = rows - requests + 1
        return spare if self._max_rows is None else min(spare, self._max_rows)

    def _apply_resident(self, logits: torch.Tensor, ctx: Any, slots_in_step: np.ndarray, resident: np.ndarray) -> None:
        known = logits.shape[0] == len(slots_in_step)  # one row per request: the host knows the layout
        slots = self._seen.slots if self._seen is not None else slots_in_step  # this step's, kept by _apply_v2
        relaid = known and self._layout is not slots and (self._layout is None or not np.array_equal(self._layout, slots))
        if relaid:
            self._prompt_offset = None  # another layout: its rows' prompt lengths are read again
        positional = self._resident.needs_positions
        states = self._req_states  # read each step: vLLM swaps the buffers these point to
        if self._thinking.tables:  # (its max_new starts at 1 + the engine's drafts: nothing to keep up)
            self._thinking.step(states.all_token_ids.gpu, states.prompt_len.gpu, states.total_len.gpu,
                                input_ids=None if known else ctx.input_ids,
                                local_pos=None if known else ctx.expanded_local_pos,
                                rows_per_request=self._rows_per_request(logits.shape[0], len(slots_in_step)))
        window = self._window.at(states.all_token_ids.gpu, states.prompt_len.gpu, ctx.pos,
                                 None if known else ctx.input_ids, None if known else ctx.expanded_local_pos)
        if known:
            if relaid:
                self._resident.set_rows(np.where(resident, slots_in_step, -1))
            self._layout = slots  # the same object while the slots stay: no comparison next step
            self._resident.use_listed_layout()
            # positions as the runner has them: the resident path subtracts only where it must
            self._resident.apply(logits, EngineStep(pos=ctx.pos, pos_offset=self._offset(ctx, known),
                                                    thinking=self._thinking.decide, window=window)
                                 if positional else self._listed_step)
        else:
            self._resident.rows_on_device(ctx.expanded_idx_mapping, slots_in_step[resident])
            real = ctx.expanded_local_pos == 0
            generated = ctx.pos - self._offset(ctx, known) if positional else None
            self._resident.apply(logits, EngineStep(generated=generated, thinking=self._thinking.decide, real_rows=real,
                                                    window=window))

    def _fail_resident_v2(self, logits: torch.Tensor, slots_in_step: np.ndarray, resident: np.ndarray,
                          exc: Exception) -> None:
        """Fail the step's resident requests (fail-stopped now where the host knows their rows)."""
        logger.error("the resident apply path failed; failing its requests", exc_info=True)
        known = logits.shape[0] == len(slots_in_step)
        for row, slot in enumerate(slots_in_step.tolist()):
            request = self._slots[slot]
            if not resident[row] or request is None:
                continue
            request.fail_with(exc, None)  # its position is on the device: not named (never as 0)
            self._resident.mark_failed(slot)
            if known:
                request.force_stop(logits[row])

    def _apply_hosted(self, logits: torch.Tensor, ctx: Any) -> None:
        """Requests with ``python``/plug-in entries: histories read back, then ``apply_rows``; where the
        host knows the layout, a failed request is stopped without one (nothing is read back for it)."""
        one_row_per_request = ctx.expanded_idx_mapping.shape[0] == len(ctx.idx_mapping_np)
        # the host's own copy when it knows the layout; under speculative decoding a read back
        row_slots = np.asarray(ctx.idx_mapping_np) if one_row_per_request else ctx.expanded_idx_mapping.cpu().numpy()
        rows = np.flatnonzero(self._is_hosted[row_slots])
        slots = row_slots[rows]
        if one_row_per_request:  # a failed request (e.g. refused at realization) needs no history to stop
            live = np.ones(len(rows), dtype=bool)
            for i, (row, slot) in enumerate(zip(rows.tolist(), slots.tolist())):
                request = self._hosted[slot]
                if request is not None and request.failed:
                    request.force_stop(logits[row])
                    live[i] = False
            rows, slots = rows[live], slots[live]
            if not len(rows):
                return
        try:
            histories = row_histories(self._req_states, ctx, rows, slots)
        except Exception as exc:  # reading the histories failed: fail these requests, keep the engine
            for row, slot in zip(rows.tolist(), slots.tolist()):
                request = self._slots[slot]
                if request is not None:
                    request.fail_with(exc, None)  # its history could not be read: its position is not known
                    request.force_stop(logits[row])
            return
        keep = [i for i, h in enumerate(histories) if h is not None]  # placeholder drafts: left untouched
        local = ctx.expanded_local_pos.cpu().numpy() if len(row_slots) != len(ctx.idx_mapping_np) else None
        real = [i for i in keep if local is None or local[rows[i]] == 0]
        drafts = [i for i in keep if local is not None and local[rows[i]] != 0]
        requests = [self._hosted[int(slots[i])] for i in real]
        apply_rows(logits, [int(rows[i]) for i in real], requests, [histories[i] for i in real])  # type: ignore[arg-type,misc]  # keep and real hold only set slots and histories
        for i in drafts:  # a failure on a draft row stops that row only (the draft may be rejected)
            request = self._hosted[int(slots[i])]
            if request is not None and not request.failed:
                apply_draft_row(request, histories[i], logits[int(rows[i])])  # type: ignore[arg-type]  # drafts come from keep: set histories
