"""A scoped ``thinking_budget`` (``scope.ScopedSpan``) is resident on both vLLM runners and waits
for nothing (the CUDA model): decided from the live lists (V1 runner) or by ``DeviceThinking`` with
the budget's automaton restarted at each stretch as after the prompt (Model Runner V2), through
batch changes and a failing request, with drafts or without. (Rows against the hosted path:
``tests/processors/test_scoped_thinking_budget.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


def _scoped_budget(i: int) -> list[dict[str, Any]]:
    """On the reasoning delimiters (scoped to reasoning), or on its own (either phase)."""
    reasoning = {"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]}
    if i % 2 == 0:
        return [reasoning, {"kind": "thinking_budget", "budget": 2 + i, "scope": "reasoning"}]
    return [reasoning, {"kind": "thinking_budget", "start_token_ids": [3, 4][: i // 2 + 1], "end_token_ids": [9, 10],
                        "budget": 2, "scope": ["reasoning", "answer"][i // 2]}]


PAYLOADS = [_scoped_budget(i) for i in range(4)]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_thinking_budget_requests_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12))
    assert [str(s) for s in result.syncs] == []


def test_scoped_thinking_budget_requests_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


def test_a_v2_step_of_scoped_budgets_is_two_fused_advances_within_the_launch_bound() -> None:
    """A steady V2 step: the scope's and the budget's fused advances (the restart at a new stretch
    and the due end token decided inside the second), the rows' decisions and the fused forcing,
    within 8 device ops; with 2 drafts a request, within 12; no read back."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops.count("spans_advance_") == 2
    assert len(steady.steady_ops) <= 8, steady.steady_ops
    with SimCuda() as sim:
        drafted = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=8, changes=False), drafts=2)
    assert [str(s) for s in drafted.syncs] == [] and not drafted.failures
    assert len(drafted.steady_ops) <= 12, drafted.steady_ops
