"""``DynamoTrtllmLogitsProcessor``: one request's processors in TensorRT-LLM's per-request callback.

``processor(req_id, logits, token_ids, stream_ptr, client_id) -> None``, editing ``logits`` in place
(``tensorrt_llm/sampling_params.py``, ``LogitsProcessor.__call__``). TensorRT-LLM 1.3.0rc29 passes
(sources in ``harness``): on the PyTorch backend a ``[beam, 1, vocab]`` view (``[1, 1, vocab]`` at
context) with one ``prompt + generated`` list per beam; on the TensorRT backend ``[1 + draft, beam,
vocab]`` with token lists without the drafts and the logits' CUDA stream in ``stream_ptr``.
``len(token_ids)`` (the beam count) tells the layouts apart (``request_rows``). Beam ``b``'s history
is ``token_ids[b][prompt_len:]``, ``prompt_len = len(token_ids[0]) - generated_before`` at the first call.
A draft row is processed only while every row before it forces one token (``sdk.apply_draft_row``),
else masked to the stop token with one WARNING per request.

Contract: nothing raises out of ``__call__`` (TensorRT-LLM would fail every active request). A
request whose payload, processor or call cannot be served is fail-stopped (every row masked to
``end_id`` unless ``ignore_eos``, else its lowest ``stop_token_ids``) and reported once (``FAILURES``).
Instances pickle as plain data plus their ``SamplingParams`` (whose ``end_id`` TensorRT-LLM fills
after ``activate``) and realize on the first call, in the engine process, with the request's facts:
the prompt (``token_ids[0][:prompt_len]``), ``end_id`` (unless ``ignore_eos``) then ``stop_token_ids``,
and the arrival ``activate`` stamped. ``register_ipc_classes`` adds the class to TensorRT-LLM's
unpickling allow-lists where they exist."""

from __future__ import annotations

import importlib
import logging
import sys
from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from dynlogits import sdk
from dynlogits.processors.base import SamplingView
from dynlogits.processors.ops import ROW_OPS, ForceToken
from dynlogits.sdk import GuardedRequest

__all__ = [
    "FAILURES",
    "HAS_TENSORRT_LLM",
    "DynamoTrtllmLogitsProcessor",
    "on_stream",
    "register_ipc_classes",
    "request_rows",
    "stop_token",
]

logger = logging.getLogger("dynlogits.adapters.trtllm")

#: The most recent failure reports of this process (oldest dropped first).
FAILURES: deque[str] = deque(maxlen=64)


def _base_classes() -> tuple[type, type, bool]:
    try:
        from tensorrt_llm.sampling_params import BatchedLogitsProcessor, LogitsProcessor
    except Exception:  # not installed, or its compiled bindings cannot load (no CUDA)
        return object, object, False
    return LogitsProcessor, BatchedLogitsProcessor, True


LogitsProcessorBase, BatchedLogitsProcessorBase, HAS_TENSORRT_LLM = _base_classes()


def _end_id(sampling_params: Any) -> int | None:
    """The request's EOS: ``end_id`` unless ``ignore_eos``."""
    end_id = getattr(sampling_params, "end_id", None)
    return end_id if isinstance(end_id, int) and not getattr(sampling_params, "ignore_eos", False) else None


def stop_token(sampling_params: Any, vocab_size: int) -> int | None:
    """The token that ends a failed request (``dynlogits.sdk.pick_stop_token``): ``end_id`` unless
    ``ignore_eos``, else its lowest ``stop_token_ids`` entry, inside the logits width."""
    return sdk.pick_stop_token(_end_id(sampling_params), getattr(sampling_params, "stop_token_ids", None), vocab_size)


def request_rows(logits: torch.Tensor, beams: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Views of one request's ``logits`` for ``beams`` token lists: its committed rows ``[beams, vocab]``
    and its draft rows ``[draft, beams, vocab]`` (``None`` without drafts). Accepts ``[1 + draft,
    beams, vocab]`` (TensorRT backend; PyTorch with one beam) and ``[beams, 1, vocab]`` (PyTorch);
    ``ValueError`` for anything else."""
    if logits.ndim == 3 and beams >= 1:
        positions, width = int(logits.shape[0]), int(logits.shape[1])
        if width == beams:
            return logits[0], (logits[1:] if positions > 1 else None)
        if width == 1 and positions == beams:
            return logits[:, 0], None
    raise ValueError(f"logits of shape {tuple(logits.shape)} do not match token_ids for {beams} beams: expected "
                     f"[1 + draft, {beams}, vocab] (TensorRT backend) or [{beams}, 1, vocab] (PyTorch backend)")


def on_stream(stream_ptr: int | None, logits: Any) -> Any:
    """A context that enqueues CUDA work on TensorRT-LLM's raw stream (nothing for CPU tensors or
    when no stream is given)."""
    if stream_ptr is None or not isinstance(logits, torch.Tensor) or not logits.is_cuda:
        return nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr, device=logits.device))


def _forced_token(request: GuardedRequest, history: Sequence[int]) -> int | None:
    """The one token ``request`` leaves in a row after ``history`` (its plan forces it and no opaque
    step follows), else ``None``. Never raises."""
    if request.failed or request.processor is None:
        return None
    try:
        plan = request.processor.plan(history)
    except Exception:
        return None
    token: int | None = None
    for step in plan:
        if isinstance(step, ForceToken):
            token = step.token_id
        elif not isinstance(step, ROW_OPS):  # an opaque processor may do anything to the row
            token = None
    return token


class DynamoTrtllmLogitsProcessor(LogitsProcessorBase):  # type: ignore[misc,valid-type]  # Any where TensorRT-LLM is absent
    """The processors of one request; built by ``activate``, never shared.

    ``sampling_params``: the ``SamplingParams`` it is attached to (stop ids read at the first
    call); ``generated_before``: tokens generated before this engine; ``vocab_size``: the width the
    payload was validated for (a call of another width fails the request); ``arrival_time``: when
    the deployment received the request (``time.time()``; ``None``: counted from realization)."""

    def __init__(self, payload: Any, *, sampling_params: Any = None, generated_before: int = 0,
                 vocab_size: int | None = None, arrival_time: float | None = None) -> None:
        if not isinstance(generated_before, int) or isinstance(generated_before, bool) or generated_before < 0:
            raise ValueError(f"generated_before must be an integer >= 0, got {generated_before!r}")
        if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size <= 0):
            raise ValueError(f"vocab_size must be a positive integer or None, got {vocab_size!r}")
        self.payload = payload
        self.sampling_params = sampling_params
        self.generated_before = generated_before
        self.vocab_size = vocab_size
        self.arrival_time = arrival_time
        self.prompt_len: int | None = None
        self._request: GuardedRequest | None = None
        self._realized = False
        self._drafts_warned = False

    # -- pickling: plain data (and the SamplingParams reference); realized again where unpickled --
    def __getstate__(self) -> dict[str, Any]:
        return {"payload": self.payload, "sampling_params": self.sampling_params,
                "generated_before": self.generated_before, "vocab_size": self.vocab_size,
                "arrival_time": self.arrival_time, "prompt_len": self.prompt_len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["payload"], sampling_params=state["sampling_params"],  # type: ignore[misc]  # unpickling rebuilds in place
                      generated_before=state["generated_before"], vocab_size=state["vocab_size"],
                      arrival_time=state.get("arrival_time"))
        self.prompt_len = state["prompt_len"]

    def stop_token(self, width: int | None) -> int | None:
        """The token that ends this request when it fails, for a logits ``width`` (unknown: the
        validated ``vocab_size``, else unbounded)."""
        return stop_token(self.sampling_params, width if width is not None else (self.vocab_size or sys.maxsize))

    def request(self, width: int, prompt_ids: Sequence[int] | None = None,
                request_id: str | None = None) -> GuardedRequest | None:
        """This request's ``GuardedRequest`` for a logits width, realized on first use with its facts
        (``prompt_ids``; stop ids and sampling parameters from ``sampling_params``; ``arrival_time``;
        ``request_id``, the engine's; no tokenizer: TensorRT-LLM gives a logits processor none). Never raises."""
        if not self._realized:
            sp = self.sampling_params
            facts = sdk.RequestFacts.of(prompt_ids=prompt_ids, eos_token_id=_end_id(sp),
                                        stop_token_ids=getattr(sp, "stop_token_ids", None) or (),
                                        arrival_time=self.arrival_time, request_id=request_id,
                                        sampling=SamplingView.read(sp))
            self._request = sdk.realize(self.payload, vocab_size=width, stop_token_id=self.stop_token(width),
                                        report=FAILURES.append, facts=facts)
            self._realized = True
        return self._request

    def prompt(self, token_ids: Sequence[Sequence[int]]) -> list[int]:
        """The prompt: the first ``prompt_len`` tokens of the engine's first list, ``prompt_len`` fixed
        by the first call (``len(token_ids[0]) - generated_before``); ``ValueError`` when it cannot be."""
        if self.prompt_len is None:
            prompt_len = len(token_ids[0]) - self.generated_before
            if prompt_len < 0:
                raise ValueError(f"token_ids hold {len(token_ids[0])} tokens, fewer than the {self.generated_before} "
                                 "the request had generated before it reached this engine")
            self.prompt_len = prompt_len
        return [int(t) for t in list(token_ids[0])[: self.prompt_len]]

    def histories(self, token_ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Each beam's generated tokens (after ``prompt_len``, fixed by the first call: ``prompt``)."""
        if self.prompt_len is None:
            self.prompt(token_ids)
        start = self.prompt_len
        return [ids[start:] if isinstance(ids, list) else list(ids)[start:] for ids in token_ids]  # no prompt copy

    def __call__(self, req_id: int, logits: torch.Tensor, token_ids: Sequence[Sequence[int]],
                 stream_ptr: int | None, client_id: int | None = None) -> None:
        try:
            sdk.drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
            with on_stream(stream_ptr, logits):
                self._apply(req_id, logits, token_ids)
        except Exception as exc:  # never let it reach TensorRT-LLM: it would fail every request
            self.fail_stop(logits, stream_ptr, exc)

    def _apply(self, req_id: int, logits: torch.Tensor, token_ids: Sequence[Sequence[int]]) -> None:
        beams = len(token_ids)
        committed, drafts = request_rows(logits, beams)
        width = int(committed.shape[-1])
        if self.vocab_size is not None and width != self.vocab_size:
            raise ValueError(f"logits are {width} wide, but the payload was validated for a vocabulary of "
                             f"{self.vocab_size} (vocabulary-sharded logits?)")
        request = self.request(width, None if self._realized else self.prompt(token_ids), request_id=str(req_id))
        if request is None:
            return
        histories = self.histories(token_ids)
        sdk.apply_rows(committed, list(range(beams)), [request] * beams, histories)
        if drafts is not None:
            self._apply_drafts(req_id, request, drafts, histories)

    def _apply_drafts(self, req_id: int, request: GuardedRequest, drafts: torch.Tensor,
                      histories: list[list[int]]) -> None:
        """Draft rows ``[draft, beams, vocab]``: see the module docstring."""
        for beam, history in enumerate(histories):
            known = list(history)
            for t in range(int(drafts.shape[0])):
                token = _forced_token(request, known)
                if token is None:
                    for row in drafts[t:, beam]:
                        request.force_stop(row)
                    if not request.failed and not self._drafts_warned:
                        self._drafts_warned = True
                        logger.warning(
                            "request %s: %d draft row(s) follow a row not forced to one token; TensorRT-LLM passes no "
                            "draft tokens, so their positions are unknown and they were masked to the stop token "
                            "(speculative decoding is refused by check_llm_args)", req_id, int(drafts.shape[0]) - t)
                    break
                known.append(token)
                sdk.apply_draft_row(request, known, drafts[t, beam])

    def fail_stop(self, logits: Any, stream_ptr: int | None, exc: Exception) -> None:
        """Fail this request for ``exc`` (reported once) and mask every row of ``logits`` to its stop
        token. Never raises."""
        try:
            width = int(logits.shape[-1]) if isinstance(logits, torch.Tensor) and logits.ndim else None
            reason = f"TensorRT-LLM's call could not be processed: {type(exc).__name__}: {exc}"
            request = self._request
            if request is None:
                request = GuardedRequest.failed_at_realization(reason, stop_token_id=self.stop_token(width),
                                                               report=FAILURES.append)
                self._request, self._realized = request, True
            elif not request.failed:
                request.fail(reason, exc_info=True)
            if width is not None:
                with on_stream(stream_ptr, logits):
                    request.force_stop(logits)
        except Exception:  # the last line of defence: log, never raise into the engine
            logger.exception("could not fail-stop a request after %r", exc)

    def __repr__(self) -> str:
        kinds = ",".join(str(e.get("kind")) for e in self.payload if isinstance(e, dict)) \
            if isinstance(self.payload, list) else "?"
        return f"{type(self).__name__}(kinds=[{kinds}], prompt_len={self.prompt_len})"


#: TensorRT-LLM's unpickling allow-lists, newest layout first (module, registration function).
_ALLOW_LISTS = (
    ("tensorrt_llm.serialization", "register_approved_class"),
    ("tensorrt_llm.llmapi.serialization", "register_approved_class"),
    ("tensorrt_llm.executor.serialization", "register_approved_ipc_class"),
)


def register_ipc_classes(*classes: type) -> list[str]:
    """Add ``classes`` to every TensorRT-LLM unpickling allow-list importable here; returns the
    registration functions used. It takes effect in this process only, so the process that
    unpickles requests must import this module before it does (see docs)."""
    used: list[str] = []
    for module, name in _ALLOW_LISTS:
        try:
            register = getattr(importlib.import_module(module), name)
            for cls in classes:
                register(cls)
        except Exception:  # absent in this TensorRT-LLM version, or not installed
            continue
        used.append(f"{module}.{name}")
    return used


if HAS_TENSORRT_LLM:
    register_ipc_classes(DynamoTrtllmLogitsProcessor)
