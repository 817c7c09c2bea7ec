"""Launch bounds of a steady step of scoped ``forced_sequence`` and ``multiple_choice`` entries on
the CUDA model (``SimCuda``): Model Runner V2 decides each row off the fused span advance's own
decision (``spans_advance_`` with ``STRETCH`` / ``FLOOR``: a row's stretch count, its floor), then
runs the inner kind's one fused op (``decided_settle_`` in its sequence form; ``multiple_choice_keep_``
with the floors as its bases); with drafts the drafts' op (``spans_drafts_``) decides them; 0 syncs.
The rows themselves are the hosted path's bit for bit (``tests/processors/test_scoped_forced.py``,
``test_scoped_decided.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

REASONING: dict[str, Any] = {"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]}
FORCED: list[dict[str, Any]] = [REASONING, {"kind": "forced_sequence", "token_ids": [9, 10, 11, 12], "eos_token_id": 1, "scope": "answer"}]
CHOICE: list[dict[str, Any]] = [REASONING, {"kind": "multiple_choice", "choices": [[9, 10], [11]], "eos_token_id": 1, "scope": "answer"}]

#: Model Runner V2, no drafts: the scope's fused advance deciding each slot, the harness's position
#: arithmetic (``sub``), each row's decision off it (``index``, ``where``), the inner kind's fused op
#: and what follows it (the flags' copy; ``multiple_choice``: the rows in phase, ``lt``, and the
#: epilogue's dead rows)
V2_STEADY = {
    "forced_sequence": ["spans_advance_", "sub", "index", "where", "decided_settle_", "copy_"],  # was 17
    "multiple_choice": ["spans_advance_", "sub", "index", "where", "lt", "multiple_choice_keep_", "dead_rows_",
                        "copy_"],  # was 11
}
#: the same with 2 drafts a request: the adapter's drafts bookkeeping, then ``spans_drafts_``
#: deciding the rows (was 25 and 20)
V2_DRAFTED_TAIL = {
    "forced_sequence": ["spans_drafts_", "decided_settle_", "copy_"],
    "multiple_choice": ["spans_drafts_", "index", "lt", "multiple_choice_keep_", "dead_rows_", "copy_"],
}
V2_DRAFTED_MOST = {"forced_sequence": 11, "multiple_choice": 14}
PAYLOADS: dict[str, list[dict[str, Any]]] = {"forced_sequence": FORCED, "multiple_choice": CHOICE}


@pytest.mark.parametrize("kind", list(PAYLOADS))
def test_a_v2_steady_step_of_a_scoped_entry_reads_its_rows_off_the_fused_advance(kind: str) -> None:
    payload = PAYLOADS[kind]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[payload, payload], steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == V2_STEADY[kind]
    assert len(steady.steady_ops) <= 8


@pytest.mark.parametrize("kind", list(PAYLOADS))
def test_a_v2_steady_step_with_drafts_decides_its_rows_in_the_drafts_op(kind: str) -> None:
    payload = PAYLOADS[kind]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[payload, payload], steps=7, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    tail = V2_DRAFTED_TAIL[kind]
    assert ops[-len(tail):] == tail and ops.count("spans_advance_") == 1, ops
    assert len(ops) <= V2_DRAFTED_MOST[kind], ops


def test_a_v1_steady_step_of_a_scoped_forced_sequence_settles_in_one_op() -> None:
    """The V1 runner (host histories): the rows' counts uploaded, the forcing and settle in one op
    that picks the tokens itself (was 8 ops: ``clamp``, ``index``, ``index`` before it)."""
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(vocab=64, payloads=[FORCED, FORCED], steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == ["copy_", "copy_", "index", "decided_settle_", "copy_"]
