"""A scoped ``trigger`` (``scope.ScopedSpan``) is resident on both vLLM runners and waits for
nothing (the CUDA model): decided from the live lists (V1 runner) or by ``DeviceThinking`` with the
trigger's automaton restarted at each stretch (Model Runner V2), through batch changes and a
failing request, with drafts or without. (Rows against the hosted path:
``tests/processors/test_scoped_trigger.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


def _scoped_trigger(i: int) -> list[dict[str, Any]]:
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]},
            {"kind": "trigger", "trigger_token_ids": [3, 4][: 1 + i % 2], "phrase_token_ids": [9, 10, 11],
             "scope": ["reasoning", "answer"][i % 2]}]


PAYLOADS = [_scoped_trigger(i) for i in range(4)]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_trigger_requests_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12))
    assert [str(s) for s in result.syncs] == []


def test_scoped_trigger_requests_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


#: a steady V2 step: the scope's fused advance, the trigger's (restarted at each stretch, advanced
#: and decided in its phase in the same op), the rows' decisions off it, the fused forcing (was 14:
#: the restart's 5 eager ops, the phase's 2)
V2_STEADY = ["spans_advance_", "spans_advance_", "sub", "index", "where", "decided_settle_", "copy_"]
#: with 2 drafts a request, after the adapter's drafts bookkeeping: the scope's rows over their
#: drafts, the trigger's rows restarted at those rows' stretches, advanced and decided (was 68 eager
#: ops there, 81 in all)
V2_DRAFTED_TAIL = ["spans_drafts_", "spans_drafts_", "decided_settle_", "copy_"]


def test_a_v2_step_of_scoped_triggers_is_two_fused_advances() -> None:
    """A steady V2 step: the trigger's restart inside its fused advance; no read back."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == V2_STEADY
    assert len(steady.steady_ops) <= 8


def test_a_v2_step_of_scoped_triggers_with_drafts_decides_the_rows_in_two_drafts_ops() -> None:
    """With 2 drafts a request: no eager op per draft, the trigger's rows restarted in the drafts op."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=7, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops[-len(V2_DRAFTED_TAIL):] == V2_DRAFTED_TAIL and ops.count("spans_advance_") == 2, ops
    assert len(ops) <= 13, ops
