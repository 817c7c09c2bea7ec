"""One request's processors inside a vLLM sampler, isolated from every other request.

Contract shared by both model runners:

* ``read_payload(params)`` is the only place that reads ``extra_args["dynamo_logits"]``.
* ``validate_request_params(params)`` is the admission check (front-end process, before the
  request is queued): it raises ``SpecError`` (a ``ValueError`` naming the field) for anything
  malformed, so vLLM fails that request alone (HTTP 400 through ``vllm serve``).
* ``realize_request(params, vocab_size, ...)`` runs in the engine process when the request enters
  the batch and returns a fresh ``GuardedRequest`` (or ``None`` when the request carries no
  payload). It never raises: a payload that only fails here (a token id beyond the logits width,
  which admission cannot know) yields a request that is already failed.

Failure policy. vLLM gives a custom logits processor no way to fail one request, and an
exception escaping the sampler kills the whole engine (every request). A ``GuardedRequest``
therefore catches its processors' exceptions, reports them (ERROR log with traceback plus the
``report`` callback) and *fail-stops* the request: from then on its row is masked to its stop
token (the request's EOS, else its lowest explicit stop token id), so it ends at once instead
of continuing unconstrained. Other requests never see the failure. A request with neither (e.g.
``ignore_eos`` and no ``stop_token_ids``) cannot be ended from the sampler: it continues
unconstrained to ``max_tokens``, and the ERROR log says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynlogits.realize import RequestLogitsProcessor, build_request_processor, validate_payload
from dynlogits.specs import WIRE_KEY

__all__ = ["FailureReport", "GuardedRequest", "read_payload", "realize_request", "validate_request_params"]

logger = logging.getLogger("dynlogits.adapters.vllm")

#: Called with a one-line description each time a request fails.
FailureReport = Callable[[str], None]


def read_payload(params: Any) -> Any | None:
    """The raw ``dynamo_logits`` payload of a ``SamplingParams``, or ``None`` when absent."""
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    return extra.get(WIRE_KEY)


def validate_request_params(params: Any) -> None:
    """Admission check: raise ``SpecError`` (``ValueError``) naming the bad field.

    The logits width is unknown in the front-end process, so ids are checked against it only
    when the request is realized in the engine (see the module's failure policy).
    """
    payload = read_payload(params)
    if payload is not None:
        validate_payload(payload)


def _stop_token(params: Any, vocab_size: int) -> int | None:
    """A token that ends this request: its EOS (unset by vLLM under ``ignore_eos``), else its
    lowest explicit stop token id, else ``None``."""
    eos = getattr(params, "eos_token_id", None)
    if isinstance(eos, int) and 0 <= eos < vocab_size:
        return eos
    stops = sorted(t for t in (getattr(params, "stop_token_ids", None) or ()) if 0 <= t < vocab_size)
    return stops[0] if stops else None


class GuardedRequest:
    """The realized processors of one request plus its failure state.

    ``__call__(output_ids, logits_row) -> logits_row`` applies the processors in place to the
    1-D row and returns that same row (vLLM's ``AdapterLogitsProcessor`` convention);
    ``output_ids`` are the tokens generated so far (drafts included under speculative decoding).
    The processors derive their position from ``len(output_ids)``, so the same request may be
    called for several rows per step, or again after preemption, without keeping step counters.
    """

    __slots__ = ("_report", "error", "processor", "stop_token_id")

    def __init__(
        self,
        processor: RequestLogitsProcessor | None,
        *,
        stop_token_id: int | None,
        report: FailureReport | None = None,
        error: str | None = None,
    ) -> None:
        self.processor = processor
        self.stop_token_id = stop_token_id
        self.error = error
        self._report = report

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __call__(self, output_ids: Sequence[int], logits_row: torch.Tensor) -> torch.Tensor:
        if self.error is None and self.processor is not None:
            try:
                self.processor(output_ids, logits_row)
                return logits_row
            except Exception as exc:  # isolate this request; see the module docstring
                self.fail_with(exc, output_ids)
        self.force_stop(logits_row)
        return logits_row

    def plan(self, output_ids: Sequence[int]) -> list[Any] | None:
        """This step's steps for ``dynlogits.batch.apply_plans``; ``None`` once the request failed
        (its row must then be fail-stopped with ``force_stop``)."""
        if self.error is None and self.processor is not None:
            try:
                return self.processor.plan(output_ids)
            except Exception as exc:  # isolate this request; see the module docstring
                self.fail_with(exc, output_ids)
        return None

    def fail_with(self, exc: Exception, output_ids: Sequence[int]) -> None:
        """Record that a processor raised ``exc`` at this position (logged and reported once)."""
        self._fail(f"{self.processor!r} raised at output position {len(output_ids)}: {type(exc).__name__}: {exc}")

    def _fail(self, reason: str) -> None:
        self.error = reason
        ending = (
            f"ending the request with stop token {self.stop_token_id}"
            if self.stop_token_id is not None
            else "the request has no stop token and continues unconstrained"
        )
        message = f"dynamo logits processor failed for one request ({reason}); {ending}; other requests are unaffected"
        logger.error(message, exc_info=True)
        if self._report is not None:
            self._report(message)

    def force_stop(self, logits_row: torch.Tensor) -> None:
        """Mask the row to the request's stop token (nothing when it has none)."""
        if self.stop_token_id is not None:
            logits_row.fill_(-math.inf)
            logits_row[self.stop_token_id] = 0.0

    @classmethod
    def failed_at_realization(
        cls, reason: str, *, stop_token_id: int | None, report: FailureReport | None
    ) -> GuardedRequest:
        request = cls(None, stop_token_id=stop_token_id, report=report)
        request._fail(reason)
        return request

    def __repr__(self) -> str:
        state = f"failed: {self.error}" if self.error else repr(self.processor)
        return f"GuardedRequest({state})"


def realize_request(params: Any, *, vocab_size: int, report: FailureReport | None = None) -> GuardedRequest | None:
    """Fresh processors for one request entering the batch; ``None`` without a payload. Never raises."""
    payload = read_payload(params)
    if payload is None:
        return None
    stop = _stop_token(params, vocab_size)
    try:
        processor = build_request_processor(payload, vocab_size=vocab_size)
    except Exception as exc:
        return GuardedRequest.failed_at_realization(
            f"payload rejected in the engine: {type(exc).__name__}: {exc}", stop_token_id=stop, report=report
        )
    if processor is None:
        return None
    return GuardedRequest(processor, stop_token_id=stop, report=report)
