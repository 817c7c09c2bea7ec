"""Where a row's position and history come from inside SGLang's sampler (SGLang 0.5.21, 0.5.23).

SGLang hands a custom processor ``custom_params["__req__"]``, a weak proxy to the real ``Req``
(``sglang/srt/managers/schedule_batch.py``: ``Req.__init__``). Its ``output_ids`` is **not** a
safe position source: under the overlap scheduler (SGLang's default) batch N+1 is sampled before
batch N's tokens are appended (``Scheduler.event_loop_overlap``: ``run_batch`` then
``pop_and_process``; SGLang issue 8056), so ``len(output_ids)`` is one short on every decode step
after the first token, and a forced sequence read from it repeats a token.

Position source: ``kv_committed_len - len(req.origin_input_ids)``. Where the counter lives is
version-dependent (``committed_len`` reads both): ``req.kv.kv_committed_len`` in 0.5.21 and 0.5.23
(``managers/schedule_batch.py``: the ``kv`` state object built in ``Req.__init__``), and
``req.kv_committed_len`` on ``Req`` itself in older releases (0.5.9's ``Req.__init__``). SGLang
updates it while it *prepares* a batch, before the forward and the sampler run (0.5.21, 0.5.23):

* extend (prefill, re-prefill after retraction, a chunk): ``= seq_len`` of the extend, the prompt
  plus the output tokens recomputed (``mem_cache/allocation.py``: ``alloc_for_extend``);
* decode: ``+= 1`` per step (``alloc_for_decode``, called from ``ScheduleBatch.prepare_for_decode``);
* retraction: ``= 0`` (``Req.reset_for_retract``), then set again by the re-prefill;
* PD-disaggregated decode: ``prompt + output - 1`` before the first decode step
  (``disaggregation/decode.py``: ``_pre_alloc_fill_len``), then ``+= 1`` as above.

So it equals ``len(prompt) + tokens generated before this row`` with the overlap scheduler on or
off, with delayed sampling, and after retraction. A negative value is a middle chunk of a chunked
prefill: SGLang discards that row's sample (``batch_result_processor.py``:
``inflight_middle_chunks``), and the row is left untouched.

History: ``output_ids[:position]``. When ``output_ids`` lags (overlap scheduler without delayed
sampling) the missing last token is not visible anywhere the processor can read; it is filled with
``LAGGED_TOKEN`` (-1) so that every kind depending only on the position is exact, and kinds that
read token values (``thinking_budget``, ``python``) see -1 for that one token. The worker avoids
the lag by enabling delayed sampling (``engine.sglang_engine_env``), with which SGLang samples
batch N+1 after batch N's tokens are appended.

Everything here reads the engine's live ``Req``: a value missing or of the wrong type raises
(``EngineStateError``, or whatever the ``Req`` proxy raises, e.g. ``ReferenceError``), and the
caller (``processor``) fails that one request, never the batch.
"""

from __future__ import annotations

import operator
from typing import Any

from dynlogits.sdk import pick_stop_token

__all__ = ["LAGGED_TOKEN", "EngineStateError", "committed_len", "row_history", "stop_token"]

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
