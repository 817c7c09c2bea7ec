"""``DynamoSglangLogitProcessor``: the SDK inside SGLang's sampler, as a real ``CustomLogitProcessor``.

How SGLang 0.5.23 calls it (each fact read from the installed package):

* Loading: a request names its processor by ``CustomLogitProcessor.to_str()``, dill of the
  **class** (``sampling/custom_logit_processor.py``). This class lives in an importable, installed
  module, so dill stores a reference (module and name), never code: the server imports this module.
  ``from_str`` caches the class but builds a **new instance on every call**.
* Instances: ``SamplingBatchInfo.from_schedule_batch`` builds one instance per processor string per
  *prefill batch*; ``filter_batch`` keeps it; ``merge_batch`` keeps the running batch's instance and
  drops the other (``sampling/sampling_batch_info.py``). So this class keeps **no state**: a
  request's realized processors and failure live in that request's own ``custom_params`` dict
  (SGLang copies it per ``Req`` in ``Req.__init__``), under ``REQUEST_KEY``, and die with it.
* Call: ``__call__(logits, custom_param_list)`` gets a **copy** of its rows (``index_select``) and
  SGLang writes back the **returned** tensor (``layers/sampler.py``: ``apply_custom_logit_processor``),
  with no try/except around the call: an exception here would fail the whole batch. Row ``i``'s
  params are ``custom_param_list[i]``; ``["__req__"]`` is the request (history: ``locate``).
* ``n > 1``: every sample is its own ``Req`` with its own ``custom_params`` dict and row, so each
  gets its own history and realized processors.
* Speculative decoding: DFlash applies custom processors on verify rows, repeating the same params
  dict for each draft row (``speculative/dflash_utils.py``); the draft tokens before a row are not
  visible to a processor, so such a request is fail-stopped and reported (the worker refuses
  speculative decoding up front, ``engine.check_server_args``). EAGLE's path does not call custom
  processors at all; UNO raises ``NotImplementedError``.

Failure policy: the SDK's (``dynlogits.sdk.guard``): a request whose payload does not realize or
whose processor raises is fail-stopped to its stop token (its lowest EOS id unless ``ignore_eos``,
else its lowest ``stop_token_ids``) and reported once (ERROR log and ``FAILURES``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from functools import cache
from typing import Any

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from dynlogits import sdk
from dynlogits.sdk import GuardedRequest

from .custom_params import carried_payload
from .locate import row_history

__all__ = ["FAILURES", "REQUEST_KEY", "DynamoSglangLogitProcessor", "processor_string", "stop_token"]

#: Key in a request's own ``custom_params`` dict holding its ``GuardedRequest`` (set in the scheduler).
REQUEST_KEY = "__dynlogits_request__"

#: The most recent failure reports of this process (oldest dropped first).
FAILURES: deque[str] = deque(maxlen=64)

_SPECULATIVE = (
    "speculative decoding verify rows: the draft tokens before each row are not visible to SGLang "
    "custom logit processors, so positions cannot be known; run without speculative decoding"
)


def stop_token(req: Any, vocab_size: int) -> int | None:
    """The token that ends ``req`` when it fails: its lowest EOS id (unless ``ignore_eos``), else its
    lowest ``stop_token_ids`` entry, inside the logits width."""
    params = req.sampling_params
    eos = () if getattr(params, "ignore_eos", False) else (getattr(req, "eos_token_ids", None) or ())
    stops = sorted(eos) or sorted(getattr(params, "stop_token_ids", None) or ())
    return sdk.pick_stop_token(None, stops, vocab_size)


def _request_for(params: dict[str, Any], req: Any, vocab_size: int) -> GuardedRequest | None:
    """The request's ``GuardedRequest``, realized on its first row and kept in its ``custom_params``."""
    if REQUEST_KEY in params:
        return params[REQUEST_KEY]
    stop = stop_token(req, vocab_size) if req is not None else None
    try:
        payload = carried_payload(params)
    except ValueError as err:
        guarded: GuardedRequest | None = GuardedRequest.failed_at_realization(
            f"payload rejected in the engine: {err}", stop_token_id=stop, report=FAILURES.append)
    else:
        guarded = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop, report=FAILURES.append)
        if guarded is not None and req is None:
            guarded = GuardedRequest.failed_at_realization(
                "custom_params has no '__req__' (SGLang adds it only when custom_params is a dict): the history is "
                "unknown", stop_token_id=None, report=FAILURES.append)
    params[REQUEST_KEY] = guarded
    return guarded


class DynamoSglangLogitProcessor(CustomLogitProcessor):
    """Applies each row's ``custom_params["dynamo_logits"]`` processors; returns ``logits``, edited
    in place (SGLang writes the returned tensor back). Stateless: see the module docstring."""

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any] | None] | None = None) -> torch.Tensor:
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
            history = row_history(req) if req is not None else []
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
            sdk.apply_rows(logits, rows, requests, histories)
        return logits


@cache
def processor_string() -> str:
    """``DynamoSglangLogitProcessor.to_str()``: what a request's ``custom_logit_processor`` carries,
    a reference to this installed class (no code). Computed on first use, never while this module is
    still importing: dill stores a class by reference only when it can find it in its imported
    module, and by value (its code) otherwise."""
    return DynamoSglangLogitProcessor.to_str()


def is_realized(params: Mapping[str, Any]) -> bool:
    """Whether a request's processors were realized (for tests and drivers)."""
    return REQUEST_KEY in params
