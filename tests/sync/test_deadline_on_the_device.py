"""``deadline`` on the CUDA model (``dynlogits.testing.cuda``), driven as Model Runner V2 drives the
adapter: decided on the host from the clock, it reads no history, so nothing is read back."""

from __future__ import annotations

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_deadline_costs_nothing_until_due_and_never_waits(drafts: int) -> None:
    """``deadline`` under Model Runner V2 is decided on the host from the clock (no history read):
    a step before it is due runs one device op (the rows' positions, which a failure report would
    read); a sequence where it is due soon after the start (and a request fails) never waits."""
    later = [[{"kind": "deadline", "seconds": 3600.0}]] * 2
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=later, steps=3, changes=False), drafts=drafts)
    assert [str(s) for s in steady.syncs] == [] and steady.steady_ops == ["sub"]
    due = [[{"kind": "deadline", "seconds": 1e-6}]] * 2  # due from the first steps (arrival: realization)
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=due, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)
