"""Where a row's position and history come from inside SGLang's sampler (SGLang 0.5.23).

SGLang hands a custom processor ``custom_params["__req__"]``, a weak proxy to the real ``Req``
(``sglang/srt/managers/schedule_batch.py``: ``Req.__init__``). Its ``output_ids`` is **not** a
safe position source: under the overlap scheduler (SGLang's default) batch N+1 is sampled before
batch N's tokens are appended (``Scheduler.event_loop_overlap``: ``run_batch`` then
``pop_and_process``; SGLang issue 8056), so ``len(output_ids)`` is one short on every decode step
after the first token, and a forced sequence read from it repeats a token.

Position source: ``req.kv.kv_committed_len - len(req.origin_input_ids)``. SGLang updates
``kv_committed_len`` while it *prepares* a batch, before the forward and the sampler run:

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
"""

from __future__ import annotations

from typing import Any

__all__ = ["LAGGED_TOKEN", "row_history"]

#: Stands for a token SGLang has sampled but not yet appended to ``output_ids`` (overlap lag).
LAGGED_TOKEN = -1


def row_history(req: Any) -> list[int] | None:
    """The history of ``req``'s row in this sampler call, or ``None`` for a row whose sample SGLang
    discards (a middle prefill chunk). ``req`` is SGLang's ``Req`` (or its ``__req__`` proxy)."""
    position = int(req.kv.kv_committed_len) - len(req.origin_input_ids)
    if position < 0:
        return None
    output = req.output_ids
    known = min(len(output), position)
    history = [int(t) for t in output[:known]]
    if known < position:
        history.extend([LAGGED_TOKEN] * (position - known))
    return history
