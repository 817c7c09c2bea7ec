"""``DynamoVllmLogitsProcessor``: one class for both of vLLM's model runners.

vLLM picks the runner after the engine arguments are fixed (``VllmConfig.use_v2_model_runner``), so
the class subclasses both ABCs and vLLM's loader picks the interface; ``__init__`` and ``apply`` tell
the two apart by argument type. Payload reading, admission, realization and failure isolation are
shared; each runner's bookkeeping is a mixin (``v1``, ``v2``). On a vLLM without the V2 interface
the class is a plain V1 ``AdapterLogitsProcessor``.

A request that fails is reported to the worker that started it when that worker opened an inbox
(``dynlogits.sdk.failure_reports``: ``DYN_LOGITS_FAILURE_SOCKET``) and marked the request with a
report id: in the engine call that finds the failure, so before that step's outputs leave the engine
core. Without an inbox (``vllm serve``) the failure is only logged and kept in ``failures``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from dynlogits.processors.base import Vocabulary
from dynlogits.processors.vocabulary import tokenizer_strings
from dynlogits.sdk import GuardedRequest
from dynlogits.sdk.failure_reports import (
    Reason,
    ReportSender,
    RequestFailure,
    entry_in_reason,
    processor_entries,
    report_id_of,
    sender,
)
from dynlogits.sdk.readback import INBOX

from .capabilities import check_vllm_config
from .engine_spec import engine_spec_for
from .native import refuse_conflicts
from .request import read_payload, realize_request, validate
from .v1 import V1RunnerMixin
from .v2 import HAS_V2_INTERFACE, LogitsProcRequestState, V2RunnerMixin

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["MAX_RECORDED_FAILURES", "DynamoVllmLogitsProcessor"]

#: How many failure messages one processor instance keeps (oldest dropped first).
MAX_RECORDED_FAILURES = 64


def _is_v2_state(obj: object) -> bool:
    return HAS_V2_INTERFACE and isinstance(obj, LogitsProcRequestState)


def engine_vocabulary(vllm_config: Any) -> Vocabulary | None:
    """The engine's ``Vocabulary``: its tokenizer (``cached_tokenizer_from_config``, vLLM's own cache)
    loaded only when a factory first reads ``RealizeContext.vocabulary``; ``None`` when the engine
    runs without one (``skip_tokenizer_init``) or the config names no model."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "skip_tokenizer_init", False):
        return None

    def load() -> list[str]:
        from vllm.tokenizers.registry import cached_tokenizer_from_config

        tokenizer = cached_tokenizer_from_config(model_config)
        if tokenizer is None:
            raise RuntimeError("vLLM gives this engine no tokenizer (skip_tokenizer_init)")
        return tokenizer_strings(tokenizer)

    return Vocabulary(load)


class DynamoVllmLogitsProcessor(V1RunnerMixin, V2RunnerMixin):
    """Applies each request's ``extra_args["dynamo_logits"]`` processors in its sampler.

    * V1 runner: ``DynamoVllmLogitsProcessor(vllm_config, device, is_pin_memory)``,
      ``update_state(batch_update)``, ``apply(logits)``.
    * Model Runner V2: ``DynamoVllmLogitsProcessor(vllm_config, req_states)``,
      ``add_request(slot, params) -> bool``, ``apply(logits, ctx)``.
    * Both: ``validate_params(params)`` raises ``SpecError`` (a ``ValueError`` naming the field) at
      admission; ``new_req_logits_processor(params)`` realizes one request (``None`` without a
      payload); a run-time failure ends only its request and is recorded in ``failures``.

    ``vocab_size`` is the logits width (``model_config.get_vocab_size()``); every payload id must be below it."""

    runner: Literal["v1", "v2"]
    vocab_size: int
    failures: deque[str]

    def __init__(self, vllm_config: VllmConfig, device_or_req_states: Any, is_pin_memory: bool = False) -> None:
        check_vllm_config(vllm_config)
        self.failures = deque(maxlen=MAX_RECORDED_FAILURES)
        #: where failures are reported (``None``: no worker's inbox), and the thread vLLM calls us on
        self.reports: ReportSender | None = sender()
        self._engine_thread = threading.get_ident()
        if self.reports is not None and INBOX.on_progress is None:
            INBOX.on_progress = self.reports.progress  # type: ignore[assignment]  # returns whether it was sent; the inbox ignores it
        self.realized = 0  # payloads realized so far: one per request (the V1 runner's re-adds reuse them)
        if _is_v2_state(device_or_req_states):
            self.runner = "v2"
            self.vocab_size = int(device_or_req_states.vocab_size)
            self._init_v2_state(vllm_config, device_or_req_states)
        else:
            self.runner = "v1"
            V1RunnerMixin.__init__(self, vllm_config, device_or_req_states, is_pin_memory)
            self.vocab_size = int(vllm_config.model_config.get_vocab_size())
            self._init_v1_state(vllm_config, device_or_req_states)
        self.engine_spec = engine_spec_for(vllm_config, self.vocab_size)  # DYN_LOGITS_SPEC_SOURCE=engine
        #: the tokenizer's text per id, for every request's RealizeContext (loaded on first read)
        self.vocabulary = engine_vocabulary(vllm_config)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Admission check for one request; raises ``SpecError`` naming the bad field (vLLM's own
        ``thinking_token_budget`` beside a ``thinking_budget`` entry included: ``native``)."""
        validate(sampling_params)
        refuse_conflicts(sampling_params)

    def new_req_logits_processor(  # type: ignore[override]  # a GuardedRequest is the (output_ids, row) callable; two optional facts more
            self, params: Any, prompt_ids: Sequence[int] | None = None,
            output_ids: Sequence[int] | None = None) -> GuardedRequest | None:
        """Fresh per-request callable ``(output_ids, row) -> row``, or ``None`` without a payload
        (``prompt_ids``: the request's prompt, where the runner gives it; ``output_ids``: its live
        output list, where the runner gives one, to name the entry a no-token row is due to)."""
        request = realize_request(params, vocab_size=self.vocab_size, report=self.failures.append,
                                   engine_spec=self.engine_spec, prompt_ids=prompt_ids, vocabulary=self.vocabulary)
        if request is not None:
            self.realized += 1
            report_id = report_id_of(params) if self.reports is not None else None
            if report_id is not None:
                request.on_failure = self._reporter(report_id, params, output_ids)
                if request.failure is not None:  # failed at realization: reported now, before its first row
                    request.on_failure(request)
        return request

    def _reporter(self, report_id: str, params: Any, output_ids: Sequence[int] | None) -> Callable[[GuardedRequest], None]:
        """The ``on_failure`` of one request: its failure sent to the worker as a ``RequestFailure``
        naming the entry (by index in the payload) where it can be known."""
        reports = self.reports
        assert reports is not None
        entries = processor_entries(read_payload(params))

        def report(request: GuardedRequest) -> None:
            failure = request.failure
            assert failure is not None
            if failure.reason is Reason.NOT_REALIZED:
                entry = entry_in_reason(failure.detail)
            else:
                processor = failure.processor
                if (processor is None and failure.reason is Reason.NO_TOKEN_LEFT and output_ids is not None
                        and failure.position is not None and threading.get_ident() == self._engine_thread):
                    # on the engine's thread, so its processors are not stepped meanwhile (not the watcher's)
                    processor = request.blame(list(output_ids[: failure.position]), self.vocab_size)
                processors = request.processor.processors if request.processor is not None else ()
                known = processor is not None and entries is not None and len(entries) == len(processors)
                entry = entries[processor] if known else None  # type: ignore[index]  # known: entries and processor are set
            reports.send(RequestFailure(report_id, failure.reason, entry, failure.position, failure.detail))

        return report

    def held_requests(self) -> int:
        """How many requests this instance holds state for: V1, those in its batch plus those realized and
        not yet released by vLLM; V2, the occupied slots with a payload. Zero once nothing is in flight."""
        if self.runner == "v2":
            return int(self._active.sum())
        return max(len(self._entries), len(self._realized))

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        """Edit the rows of requests with a payload in place and return ``logits``."""
        if self.runner == "v2":
            if ctx is None:
                raise TypeError("Model Runner V2 calls apply(logits, ctx); ctx is missing")
            return self._apply_v2(logits, ctx)
        return self._apply_v1(logits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(runner={self.runner!r}, vocab_size={self.vocab_size})"
