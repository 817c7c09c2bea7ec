"""``DynamoSglangLogitProcessor``: the SDK inside SGLang's sampler, as a real ``CustomLogitProcessor``.

How SGLang 0.5.21 and 0.5.23 call it (files under ``sglang/srt/``; details in docs/engines.md):

* ``to_str()`` is dill of the class, stored by reference (this module is importable); ``from_str``
  builds a new instance per call, and ``sampling/sampling_batch_info.py`` keeps only the running
  batch's instance on ``merge_batch``. So the class is stateless: a request's ``GuardedRequest``
  lives in its own ``custom_params`` dict under ``REQUEST_KEY`` (copied per ``Req`` in ``Req.__init__``).
* ``__call__(logits, custom_param_list)`` gets a copy of its rows and SGLang writes back the returned
  tensor (``layers/sampler.py``: ``apply_custom_logit_processor``), with no try/except around it.
* Speculative verify rows repeat one params dict per draft row (``speculative/dflash_utils.py``:
  ``apply_dflash_verify_logits_adjustments``): such a request is fail-stopped (``engine`` refuses
  speculative decoding up front).

Contract: never raises into the sampler. A request whose payload does not realize, whose ``Req``
cannot be read or whose processor raises is fail-stopped to its stop token (``locate.stop_token``)
and reported once (ERROR log and ``FAILURES``). Every edit is a function of the payload, the ``Req``
and the row, so TP ranks stay in step (``python`` factories must be deterministic too)."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from functools import cache
from typing import Any

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from dynlogits import sdk
from dynlogits.processors.base import SamplingView, Vocabulary
from dynlogits.sdk import GuardedRequest

from .custom_params import carried_payload
from .engine import speculative_refusal
from .locate import request_facts, row_history, stop_token

__all__ = ["FAILURES", "REQUEST_KEY", "DynamoSglangLogitProcessor", "processor_string", "stop_token"]

#: Key in a request's own ``custom_params`` dict holding its ``GuardedRequest`` (set in the scheduler).
REQUEST_KEY = "__dynlogits_request__"

#: The most recent failure reports of this process (oldest dropped first).
FAILURES: deque[str] = deque(maxlen=64)

_SPECULATIVE = (
    "speculative decoding verify rows: the draft tokens before each row are not visible to SGLang "
    "custom logit processors, so positions cannot be known; run without speculative decoding"
)

_UNSUPPORTED_LAYOUT = "this SGLang version's Req layout is not supported (proven: SGLang 0.5.21, 0.5.23)"


def _engine_refusal() -> str | None:
    """Why this scheduler cannot run processors (speculative decoding), from the server args SGLang
    published in this process (``srt/runtime_context.py``: ``get_server_args``, 0.5.21 and 0.5.23);
    ``None`` when it can or the setting cannot be read. Covers an engine started without
    ``engine.check_server_args`` (EAGLE-family decoding calls processors for the first token only)."""
    try:
        from sglang.srt import runtime_context

        algorithm = runtime_context.get_server_args().speculative_algorithm
    except Exception:
        return None
    return speculative_refusal(algorithm)


#: SGLang's ``top_k`` for "no top-k" once it normalized a request's parameters
#: (``sglang.srt.sampling.sampling_params.TOP_K_ALL``, 0.5.23).
_TOP_K_ALL = 1 << 30


def _with_engine_facts(facts: sdk.RequestFacts, req: Any) -> sdk.RequestFacts:
    """``facts`` plus what SGLang's ``Req`` says for a factory's ``RealizeContext``: its ``rid``, its
    sampling parameters and its tokenizer's vocabulary (``None`` where the scheduler set no tokenizer,
    e.g. ``skip_tokenizer_init``)."""
    rid = getattr(req, "rid", None)
    sampling = SamplingView.read(getattr(req, "sampling_params", None), max_tokens="max_new_tokens", seed="sampling_seed")
    if sampling.top_k is not None and sampling.top_k >= _TOP_K_ALL:  # SGLang's "whole vocabulary": off
        sampling = dataclasses.replace(sampling, top_k=None)
    return dataclasses.replace(facts, request_id=None if rid is None else str(rid), sampling=sampling,
                               vocabulary=Vocabulary.of_tokenizer(getattr(req, "tokenizer", None)))


def _realized(params: dict[str, Any], req: Any, vocab_size: int) -> GuardedRequest | None:
    """Realize the request's payload (either encoding) with its facts (``locate.request_facts``);
    never raises."""
    stop = stop_token(req, vocab_size) if req is not None else None
    try:
        payload = carried_payload(params)
    except Exception as err:  # SpecError; anything else reading the engine's dict is this request's fault too
        return GuardedRequest.failed_at_realization(
            f"payload rejected in the engine: {err}", stop_token_id=stop, report=FAILURES.append)
    try:
        facts = _with_engine_facts(request_facts(req, params), req) if req is not None else None
    except Exception as exc:  # a Req this adapter cannot read: this request's failure, not the sampler's
        return GuardedRequest.failed_at_realization(
            f"cannot read the request's prompt or stop ids from SGLang's Req ({type(exc).__name__}: {exc}); "
            f"{_UNSUPPORTED_LAYOUT}", stop_token_id=stop, report=FAILURES.append)
    try:
        guarded = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop, report=FAILURES.append, facts=facts)
    except Exception as exc:  # realize never raises by contract; a bug must still not reach the sampler
        return GuardedRequest.failed_at_realization(
            f"internal error realizing the payload ({type(exc).__name__}: {exc})", stop_token_id=stop,
            report=FAILURES.append)
    if guarded is not None and not guarded.failed and (refusal := _engine_refusal()) is not None:
        guarded = GuardedRequest.failed_at_realization(refusal, stop_token_id=stop, report=FAILURES.append)
    if guarded is not None and req is None:
        guarded = GuardedRequest.failed_at_realization(
            "custom_params has no '__req__' (SGLang adds it only when custom_params is a dict): the history is "
            "unknown", stop_token_id=None, report=FAILURES.append)
    return guarded


def _request_for(params: dict[str, Any], req: Any, vocab_size: int) -> GuardedRequest | None:
    """The request's ``GuardedRequest``, realized on its first row and kept in its ``custom_params``."""
    if REQUEST_KEY in params:
        return params[REQUEST_KEY]
    guarded = _realized(params, req, vocab_size)
    params[REQUEST_KEY] = guarded
    return guarded


def _history(request: GuardedRequest, req: Any) -> list[int] | None:
    """The row's history (``None``: a discarded middle-chunk row). A ``Req`` this adapter cannot read
    fails ``request`` (its row is then fail-stopped) instead of raising into SGLang's sampler."""
    if req is None:
        return []
    try:
        return row_history(req)
    except Exception as exc:
        request.fail(f"cannot read the row's position or history from SGLang's Req ({type(exc).__name__}: {exc}); "
                     f"{_UNSUPPORTED_LAYOUT}")
        return []


class DynamoSglangLogitProcessor(CustomLogitProcessor):
    """Applies each row's ``custom_params["dynamo_logits"]`` processors; returns ``logits``, edited in
    place (SGLang writes the returned tensor back). Stateless (see the module docstring).

    Never raises into SGLang's sampler: a row's request that cannot be served is fail-stopped and
    reported; an internal error fail-stops the requests of this call."""

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any] | None] | None = None) -> torch.Tensor:
        sdk.drain()  # failures that landed since the last call (see dynlogits.sdk.readback)
        if not custom_param_list:
            return logits
        vocab_size = int(logits.shape[-1])
        rows: list[int] = []
        requests: list[GuardedRequest] = []
        histories: list[list[int]] = []
        previous: Any = None
        for row, params in enumerate(custom_param_list):
            if not isinstance(params, dict):
                previous = params
                continue
            req = params.get("__req__")
            request = _request_for(params, req, vocab_size)
            if request is None:
                previous = params
                continue
            history = _history(request, req)
            if history is None:  # a middle prefill chunk: SGLang discards this row's sample
                previous = params
                continue
            if params is previous and not request.failed:
                request.fail_with(NotImplementedError(_SPECULATIVE), history)
            previous = params
            rows.append(row)
            requests.append(request)
            histories.append(history)
        if rows:
            try:
                sdk.apply_rows(logits, rows, requests, histories)
            except Exception as exc:  # a bug, not a request's fault: stop these requests, keep the engine
                for row, request in zip(rows, requests):
                    request.fail(f"internal error in the SGLang adapter ({type(exc).__name__}: {exc})", exc_info=True)
                    request.force_stop(logits[row])
        return logits


@cache
def processor_string() -> str:
    """``DynamoSglangLogitProcessor.to_str()``: what a request's ``custom_logit_processor`` carries, a
    reference to this installed class (no code). Computed on first use, never at import time: dill
    stores a class by reference only once its module is imported."""
    return DynamoSglangLogitProcessor.to_str()


def is_realized(params: Mapping[str, Any]) -> bool:
    """Whether a request's processors were realized (for tests and drivers)."""
    return REQUEST_KEY in params
