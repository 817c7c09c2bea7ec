"""Where a row's position and history come from inside SGLang's sampler (SGLang 0.5.21, 0.5.23).

Position: ``committed_len(req) - len(req.origin_input_ids)``, not ``len(req.output_ids)``, which
lags one token under the overlap scheduler (``Scheduler.event_loop_overlap``; SGLang issue 8056).
SGLang sets ``req.kv.kv_committed_len`` (``req.kv_committed_len`` in older releases, e.g. 0.5.9)
while preparing a batch, before the sampler: ``mem_cache/allocation.py`` ``alloc_for_extend`` /
``alloc_for_decode``, ``Req.reset_for_retract``, ``disaggregation/decode.py`` ``_pre_alloc_fill_len``.
A negative position is a middle prefill chunk, whose sample SGLang discards: the row is left untouched.

History: ``output_ids[:position]``, a lagging last token filled with ``LAGGED_TOKEN`` (-1).

Facts (``request_facts``, what a factory's ``RealizeContext`` holds): the prompt is
``req.origin_input_ids``; the stop ids are the request's own, which ``Req._check_token_based_finish``
stops on (``managers/schedule_batch.py``, 0.5.21 and 0.5.23): ``req.eos_token_ids`` (unless
``ignore_eos``) and ``sampling_params.stop_token_ids`` (the tokenizer's EOS and additional stop ids,
which it also stops on, are not listed); the arrival is the one activation wrote into the request's
``custom_params``.

Reads of the live ``Req`` raise (``EngineStateError``, ``ReferenceError``, ...) when a value is
missing or malformed; the caller fails that one request."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from dynlogits import sdk
from dynlogits.sdk import pick_stop_token

__all__ = ["LAGGED_TOKEN", "EngineStateError", "committed_len", "request_facts", "row_history", "stop_token"]

#: Stands for a token SGLang has sampled but not yet appended to ``output_ids`` (overlap lag).
LAGGED_TOKEN = -1


class EngineStateError(RuntimeError):
    """A value this adapter reads from SGLang's ``Req`` is missing or malformed (an SGLang version
    whose layout this adapter does not know)."""


def committed_len(req: Any) -> int:
    """``req``'s committed KV length: ``req.kv.kv_committed_len`` (0.5.21, 0.5.23), else
    ``req.kv_committed_len`` (older SGLang); ``EngineStateError`` when neither is an integer."""
    kv = getattr(req, "kv", None)
    value = getattr(kv, "kv_committed_len", None) if kv is not None else None
    if value is None:
        value = getattr(req, "kv_committed_len", None)
    if value is None or isinstance(value, bool):
        raise EngineStateError(
            "SGLang's Req has neither kv.kv_committed_len (SGLang 0.5.21, 0.5.23) nor kv_committed_len (older "
            "releases): the row's position is unknown")
    try:
        return operator.index(value)
    except TypeError:
        raise EngineStateError(f"SGLang's Req kv_committed_len is {type(value).__name__}, not an integer") from None


def row_history(req: Any) -> list[int] | None:
    """The history of ``req``'s row in this sampler call, or ``None`` for a row whose sample SGLang
    discards (a middle prefill chunk). ``req`` is SGLang's ``Req`` (or its ``__req__`` proxy).
    Raises when ``req`` lacks what is read (see the module docstring)."""
    position = committed_len(req) - len(req.origin_input_ids)
    if position < 0:
        return None
    output = req.output_ids
    known = min(len(output), position)
    history = [int(t) for t in output[:known]]
    if known < position:
        history.extend([LAGGED_TOKEN] * (position - known))
    return history


def stop_token(req: Any, vocab_size: int) -> int | None:
    """The token that ends ``req`` when it fails: its lowest EOS id (unless ``ignore_eos``), else its
    lowest ``stop_token_ids`` entry, inside the logits width; ``None`` when ``req`` cannot say."""
    try:
        params = req.sampling_params
        eos = () if getattr(params, "ignore_eos", False) else (getattr(req, "eos_token_ids", None) or ())
        stops = sorted(eos) or sorted(getattr(params, "stop_token_ids", None) or ())
    except Exception:  # an engine object of an unknown layout: the request still fails, unstoppable
        return None
    return pick_stop_token(None, stops, vocab_size)


def request_facts(req: Any, custom_params: Mapping[str, Any]) -> sdk.RequestFacts:
    """What a factory is told of ``req`` (see the module docstring): its prompt, its stop ids (the
    lowest EOS first, as ``stop_token`` picks; none of them under ``ignore_eos``) and the arrival in
    ``custom_params``. Raises when ``req`` lacks what is read."""
    params = req.sampling_params
    eos = () if getattr(params, "ignore_eos", False) else tuple(getattr(req, "eos_token_ids", None) or ())
    stops = tuple(getattr(params, "stop_token_ids", None) or ())
    return sdk.RequestFacts.of(prompt_ids=[int(t) for t in req.origin_input_ids], eos_token_id=min(eos, default=None),
                               stop_token_ids=(*eos, *stops), arrival_time=sdk.carried_arrival(custom_params))
