"""A scoped ``deadline`` (``scope.ScopedClock``) is resident on both vLLM runners and waits for
nothing (the CUDA model): its clock is read on the host, its phase from the live lists (V1 runner)
or by ``DeviceThinking`` (Model Runner V2), through batch changes, with drafts or without. Not yet
due, a Model Runner V2 step runs nothing of it beyond the span's advance. (Rows against the hosted
path: ``tests/processors/test_scoped_deadline.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


def _scoped_deadline(i: int, seconds: float) -> list[dict[str, Any]]:
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]},
            {"kind": "deadline", "seconds": seconds, "scope": ["reasoning", "answer"][i % 2]}]


#: two due from the start, two due in an hour
PAYLOADS = [_scoped_deadline(i, [1e-6, 3600.0][i // 2]) for i in range(4)]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_deadline_requests_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12))
    assert [str(s) for s in result.syncs] == []


def test_scoped_deadline_requests_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


def test_a_v2_step_of_scoped_deadlines_not_yet_due_only_advances_the_span() -> None:
    """Not due: the clock read on the host decides nothing, so the step is the span's one fused
    advance (and the harness's position arithmetic): no op of the deadline's own."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS[2:], steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == ["spans_advance_", "sub"]
