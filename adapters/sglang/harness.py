"""A model of SGLang's scheduler around its real classes (a test helper, not the engine).

Real: ``Req``, ``ScheduleBatch``, requests through SGLang's own transport (msgpack or pickle,
``decode_like_sglang``), the ``SamplingBatchInfo`` life cycle (``from_schedule_batch`` per prefill
batch, ``filter_batch``, ``merge_batch``), ``Req.reset_for_retract`` and ``apply_custom_logit_processor``.
Modelled, in ``sglang/srt/managers/scheduler.py`` ``event_loop_overlap``'s order:

* prefill / re-prefill: ``req.kv.kv_committed_len = len(prompt) + len(output_ids)``
  (``mem_cache/allocation.py``: ``alloc_for_extend``), sampled as its own batch, then merged;
* decode: ``kv_committed_len += 1`` (``alloc_for_decode`` in ``prepare_for_decode``) before sampling;
* results appended after the step, or after the next step in ``mode="overlap"`` (SGLang issue 8056);
* a request missing from a step is retracted and re-prefilled (its last sampled token appended
  first, where SGLang would drop it and sample that position again)."""

from __future__ import annotations

import pickle
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .compat import import_sglang_srt

__all__ = ["Ipc", "HarnessRequest", "Mode", "ReqView", "SglangSchedulerHarness", "decode_like_sglang", "publish_server_args"]

Mode = Literal["overlap", "overlap-delay-sample", "no-overlap"]

#: SGLang's tokenizer-to-scheduler transport (``managers/io_struct.py``: ``sock_send``/``sock_recv``,
#: 0.5.21 and 0.5.23): ``"pickle"`` when ``SGLANG_USE_PICKLE_IPC`` is on (its default, ``srt/environ.py``),
#: ``"msgpack"`` (typed msgspec decoding) when it is off.
Ipc = Literal["pickle", "msgpack"]

_PUBLISHED: Any = None  # the default configuration, published once per process


def publish_server_args(**overrides: Any) -> Any:
    """Publish a real ``ServerArgs`` (CPU device, custom logit processors on, the embedded model
    unless ``model_path`` is given) as the process-wide SGLang configuration that
    ``SamplingBatchInfo`` reads; returns it."""
    global _PUBLISHED
    if _PUBLISHED is not None and not overrides:
        return _PUBLISHED
    import_sglang_srt()
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    from dynlogits.model_builder import default_model_dir

    overrides.setdefault("model_path", str(default_model_dir()))  # a local model: SGLang reads its config
    server_args = ServerArgs(device="cpu", enable_custom_logit_processor=True, **overrides)
    publish(server_args, role="scheduler")
    _PUBLISHED = server_args if len(overrides) == 1 else None
    return server_args


def decode_like_sglang(sampling_params: Mapping[str, Any], *, rid: str, input_ids: Sequence[int],
                       custom_logit_processor: str | None, ipc: Ipc = "msgpack") -> Any:
    """The ``TokenizedGenerateReqInput`` the scheduler receives: built from the request fields and
    sent through SGLang's transport ``ipc``: its own msgpack codec (``io_struct.msgpack_encode``/
    ``msgpack_decode``, whose typed decoding is what a ``custom_params`` value must survive), or a
    pickle round trip (``send_pyobj``/``recv_pyobj``). Raises what SGLang raises."""
    import_sglang_srt()
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput, msgpack_decode, msgpack_encode
    from sglang.srt.sampling.sampling_params import SamplingParams

    request = TokenizedGenerateReqInput(
        rid=rid, input_text=None, input_ids=array("q", input_ids), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=SamplingParams(**dict(sampling_params)), return_logprob=False,
        logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
        custom_logit_processor=custom_logit_processor,
    )
    if ipc == "pickle":
        return pickle.loads(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
    return msgpack_decode(msgpack_encode(request))


class ReqView:
    """SGLang's ``Req`` as another SGLang version would present it: the real ``Req``'s attributes, except
    that ``hidden`` names raise ``AttributeError`` and ``renamed`` maps a name to an attribute path
    (``{"kv_committed_len": ("kv", "kv_committed_len")}``: SGLang 0.5.9 and older)."""

    def __init__(self, req: Any, *, hidden: Sequence[str] = (), renamed: Mapping[str, Sequence[str]] | None = None) -> None:
        self._req, self._hidden, self._renamed = req, frozenset(hidden), dict(renamed or {})

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(f"{type(self._req).__name__!r} object has no attribute {name!r} (hidden by the harness)")
        if name in self._renamed:
            value = self._req
            for part in self._renamed[name]:
                value = getattr(value, part)
            return value
        return getattr(self._req, name)


@dataclass
class HarnessRequest:
    """One request in the harness: SGLang's ``Req`` and the token sampled but not yet appended."""

    req: Any
    pending: int | None = None
    running: bool = False
    calls: list[tuple[int, int]] = field(default_factory=list)  # (len(output_ids), position) seen at sampling


class SglangSchedulerHarness:
    """See the module docstring. Requests are added with ``add``, run with ``step`` (rows in the
    caller's order), given their sampled token with ``commit`` and ended with ``remove``."""

    def __init__(self, vocab_size: int, *, mode: Mode = "overlap-delay-sample", ipc: Ipc = "msgpack") -> None:
        import_sglang_srt()
        publish_server_args()
        self.vocab_size = vocab_size
        self.mode: Mode = mode
        self.ipc: Ipc = ipc
        self.requests: dict[str, HarnessRequest] = {}
        self.running: list[str] = []
        self.running_info: Any = None

    @property
    def lagging(self) -> bool:
        """Whether ``output_ids`` lags one token at sampling time (overlap without delayed sampling)."""
        return self.mode == "overlap"

    def add(self, rid: str, *, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
            custom_logit_processor: str | None, output_ids: Sequence[int] = (), eos_token_ids: set[int] | None = None) -> Any:
        """A request arrives (``output_ids``: tokens it generated before a preemption); returns its ``Req``."""
        from sglang.srt.managers.schedule_batch import Req

        wire = decode_like_sglang(sampling_params, rid=rid, input_ids=prompt_ids,
                                  custom_logit_processor=custom_logit_processor, ipc=self.ipc)
        req = Req(rid, "", array("q", wire.input_ids), wire.sampling_params,
                  custom_logit_processor=wire.custom_logit_processor, eos_token_ids=eos_token_ids,
                  vocab_size=self.vocab_size)
        req.output_ids.extend(int(t) for t in output_ids)
        self.requests[rid] = HarnessRequest(req)
        return req

    def _append_pending(self, held: HarnessRequest) -> None:
        if held.pending is not None:
            held.req.output_ids.append(held.pending)
            held.pending = None

    def _filter_running(self, keep: list[str]) -> None:
        if keep == self.running:
            return
        indices = [self.running.index(r) for r in keep]
        if not indices:
            self.running, self.running_info = [], None
            return
        self.running_info.filter_batch(indices, torch.tensor(indices, dtype=torch.long))
        self.running = keep

    def _sample(self, info: Any, rids: list[str], logits: torch.Tensor, rows: dict[str, int]) -> None:
        from sglang.srt.layers.sampler import apply_custom_logit_processor

        index = torch.tensor([rows[r] for r in rids], dtype=torch.long)
        part = logits.index_select(0, index)
        for r in rids:
            req = self.requests[r].req
            self.requests[r].calls.append((len(req.output_ids), req.kv.kv_committed_len - len(req.origin_input_ids)))
        if info.has_custom_logit_processor:
            apply_custom_logit_processor(part, info)
        logits.index_copy_(0, index, part)

    def step(self, batch: Sequence[str], logits: torch.Tensor) -> torch.Tensor:
        """One scheduler iteration over ``batch`` (row ``i`` of ``logits`` is ``batch[i]``); returns ``logits``."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        rows = {rid: i for i, rid in enumerate(batch)}
        for rid in self.running:
            if rid not in rows:  # retracted: out of the running batch, back later through a re-prefill
                held = self.requests[rid]
                self._append_pending(held)
                held.req.reset_for_retract()
                held.running = False
        self._filter_running([r for r in self.running if r in rows])
        if not self.lagging:
            for rid in batch:
                self._append_pending(self.requests[rid])
        for rid in self.running:  # prepare_for_decode -> alloc_for_decode
            self.requests[rid].req.kv.kv_committed_len += 1
        new = [rid for rid in batch if not self.requests[rid].running]
        prefill_info = None
        if new:
            reqs = [self.requests[rid].req for rid in new]
            for req in reqs:  # alloc_for_extend: the prompt plus the output tokens recomputed
                self._append_pending(self.requests[req.rid])
                req.kv.kv_committed_len = len(req.origin_input_ids) + len(req.output_ids)
                req.is_retracted = False
            prefill_info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=reqs, device="cpu"), self.vocab_size)
            self._sample(prefill_info, new, logits, rows)
        if self.running:
            self._sample(self.running_info, self.running, logits, rows)
        if self.lagging:  # the previous batch's results are processed after this batch was sampled
            for rid in self.running:
                self._append_pending(self.requests[rid])
        if prefill_info is not None:  # the prefill batch joins the running batch
            if self.running_info is None:
                self.running_info = prefill_info
            else:
                self.running_info.merge_batch(prefill_info)
            self.running += new
            for rid in new:
                self.requests[rid].running = True
        return logits

    def commit(self, rid: str, token_id: int) -> None:
        """The token sampled for ``rid`` in the last step (appended now, or after the next step under lag)."""
        held = self.requests[rid]
        if self.lagging:
            self._append_pending(held)
            held.pending = int(token_id)
        else:
            held.req.output_ids.append(int(token_id))

    def present_req_as(self, rid: str, *, hidden: Sequence[str] = (),
                       renamed: Mapping[str, Sequence[str]] | None = None) -> None:
        """From now on the processor sees ``rid``'s ``Req`` through a ``ReqView`` (its
        ``custom_params["__req__"]``, where ``Req.__init__`` put the request); the scheduler's own
        bookkeeping keeps using the real ``Req``."""
        req = self.requests[rid].req
        req.sampling_params.custom_params["__req__"] = ReqView(req, hidden=hidden, renamed=renamed)

    def remove(self, rid: str) -> None:
        """The request finished or was aborted: it leaves the running batch and the harness."""
        if rid in self.running:
            self._filter_running([r for r in self.running if r != rid])
        self.requests.pop(rid, None)
