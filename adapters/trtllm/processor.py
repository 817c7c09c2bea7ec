"""``DynamoTrtllmLogitsProcessor``: one request's processors in TensorRT-LLM's per-request callback.

Calling convention (TensorRT-LLM ``tensorrt_llm/sampling_params.py``: ``LogitsProcessor``):
``processor(req_id, logits, token_ids, stream_ptr, client_id) -> None``, editing ``logits`` **in
place**; the return value is ignored.

* PyTorch backend 1.2.x (``PyTorchModelEngine._execute_logit_post_processors``): ``logits`` is a
  ``[1, 1, vocab]`` view of the request's row, ``token_ids`` is ``[prompt + generated]`` for one
  beam, ``stream_ptr`` and ``client_id`` are ``None``; the row is written back after the call. Only
  the last context chunk and decode steps call it.
* Newer PyTorch backends (TensorRT-LLM PR 16010): ``logits`` is a ``[beam, 1, vocab]`` view, and
  ``token_ids`` holds one list per beam.
* TensorRT backend: ``stream_ptr`` is the raw CUDA stream the logits live on; work is enqueued on it.

Any beam width is supported; beam ``b`` is row ``b`` and its history is ``token_ids[b][prompt_len:]``,
``prompt_len`` recorded when the processor was attached (``attach``). Positions come from that
history only (``dynlogits.sdk``), so the processor keeps no step counter.

Failure policy: TensorRT-LLM lets an exception escape ``forward`` and then fails **every active
request**, so nothing raises out of ``__call__``: a payload that does not realize, a processor that
raises, or a call this processor cannot read (a beam count that does not match ``token_ids``)
fail-stops this request only (its rows masked to its stop token from then on) and is reported once
(ERROR log and ``FAILURES``).

Pickling: requests cross process boundaries pickled, so an instance holds only its payload (plain
data), ``prompt_len`` and stop ids; it realizes its processors on its first call in the engine
process, where ``python`` entries are checked against that process's allow-list. The class is
importable by its module path (``dynlogits.adapters.trtllm.processor``), as TensorRT-LLM's approved
IPC class lists require. It subclasses TensorRT-LLM's ``LogitsProcessor`` when ``tensorrt_llm``
imports (it needs its CUDA bindings), and is duck-typed otherwise.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from dynlogits import sdk
from dynlogits.sdk import GuardedRequest

__all__ = ["FAILURES", "HAS_TENSORRT_LLM", "DynamoTrtllmLogitsProcessor", "logits_rows", "on_stream"]

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


def logits_rows(logits: torch.Tensor) -> torch.Tensor:
    """A ``[rows, vocab]`` **view** of the logits TensorRT-LLM passes (``[beam, 1, vocab]``,
    ``[beam, vocab]`` or ``[vocab]``), so edits land in the engine's tensor."""
    if logits.ndim == 3:
        if logits.shape[1] != 1:
            raise ValueError(f"expected logits of shape [beam, 1, vocab], got {tuple(logits.shape)}")
        return logits.select(1, 0)
    if logits.ndim == 2:
        return logits
    if logits.ndim == 1:
        return logits.unsqueeze(0)
    raise ValueError(f"expected logits of shape [beam, 1, vocab], got {tuple(logits.shape)}")


def on_stream(stream_ptr: int | None, logits: torch.Tensor) -> Any:
    """A context that enqueues CUDA work on TensorRT-LLM's raw stream (nothing for CPU tensors or
    when no stream is given)."""
    if stream_ptr is None or not logits.is_cuda:
        return nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr, device=logits.device))


class DynamoTrtllmLogitsProcessor(LogitsProcessorBase):  # type: ignore[misc,valid-type]
    """The processors of one request (see the module docstring). Build it with
    ``activate``; one instance per request, never shared."""

    def __init__(self, payload: list[dict[str, Any]], *, prompt_len: int, stop_token_ids: Iterable[int] = ()) -> None:
        if not isinstance(prompt_len, int) or isinstance(prompt_len, bool) or prompt_len < 0:
            raise ValueError(f"prompt_len must be an integer >= 0, got {prompt_len!r}")
        self.payload = payload
        self.prompt_len = prompt_len
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._request: GuardedRequest | None = None
        self._realized = False

    # -- pickling: plain data only; processors are realized again in the receiving process -------
    def __getstate__(self) -> dict[str, Any]:
        return {"payload": self.payload, "prompt_len": self.prompt_len, "stop_token_ids": self.stop_token_ids}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.payload = state["payload"]
        self.prompt_len = state["prompt_len"]
        self.stop_token_ids = tuple(state["stop_token_ids"])
        self._request = None
        self._realized = False

    def request(self, vocab_size: int) -> GuardedRequest | None:
        """This request's ``GuardedRequest`` for a logits width, realized on first use (never raises)."""
        if not self._realized:
            ids = self.stop_token_ids  # best first: the EOS, then explicit stop ids
            stop = sdk.pick_stop_token(ids[0] if ids else None, ids[1:], vocab_size)
            self._request = sdk.realize(self.payload, vocab_size=vocab_size, stop_token_id=stop, report=FAILURES.append)
            self._realized = True
        return self._request

    def histories(self, token_ids: Sequence[Sequence[int]], beams: int) -> list[list[int]]:
        """Each beam's generated tokens (``ValueError`` when ``token_ids`` does not match the rows)."""
        if len(token_ids) != beams:
            raise ValueError(f"{beams} logits rows (beams) but token_ids for {len(token_ids)} beams")
        return [list(ids[self.prompt_len:]) for ids in token_ids]

    def fail_stop(self, rows: torch.Tensor | None, exc: Exception) -> None:
        """Fail this request for ``exc`` (reported once) and mask ``rows`` to its stop token."""
        request = self._request
        if request is None:  # nothing realized yet: report it as a realization failure
            request = GuardedRequest.failed_at_realization(
                f"{type(exc).__name__}: {exc}", stop_token_id=None, report=FAILURES.append)
            self._request, self._realized = request, True
        elif not request.failed:
            request.fail_with(exc, [])
        if rows is not None:
            for r in range(rows.shape[0]):
                request.force_stop(rows[r])

    def __call__(self, req_id: int, logits: torch.Tensor, token_ids: Sequence[Sequence[int]],
                 stream_ptr: int | None, client_id: int | None = None) -> None:
        rows: torch.Tensor | None = None
        try:
            rows = logits_rows(logits)
            request = self.request(int(rows.shape[-1]))
            if request is None:
                return
            histories = self.histories(token_ids, int(rows.shape[0]))
            with on_stream(stream_ptr, logits):
                sdk.apply_rows(rows, list(range(rows.shape[0])), [request] * rows.shape[0], histories)
        except Exception as exc:  # never let it reach TensorRT-LLM: it would fail every request
            logger.debug("request %s: processor call failed", req_id, exc_info=True)
            with on_stream(stream_ptr, logits):
                self.fail_stop(rows, exc)

    def __repr__(self) -> str:
        kinds = ",".join(str(e.get("kind")) for e in self.payload) if isinstance(self.payload, list) else "?"
        return f"{type(self).__name__}(kinds=[{kinds}], prompt_len={self.prompt_len})"
