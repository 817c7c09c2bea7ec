"""``watermark`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM's runners drive the
adapter: it runs resident (``watermark_resident``), after the request's other resident entries, and
no step waits for the device on either runner.

* V1 runner: each member row's processor decides on the host (its context's PRF state, four
  words), the firing rows go up in the step's one non-blocking upload, and one batched draw forces
  them: a steady step is ``V1_STEADY`` device ops, however many rows draw.
* Model Runner V2: the context, its repeats and the PRF state are found on the device from the
  runner's token matrix (``TokenWindow``); nothing is read back: ``V2_STEADY`` ops a steady step
  (``V2_DRAFTS`` with drafts), however many rows."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")

WATERMARK: dict[str, Any] = {"kind": "watermark", "key": 2**64 - 5, "context_width": 4}
PAYLOAD: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": [3]}, WATERMARK]

#: a steady step's device ops, the watermark alone (the ban before it adds its one masked write):
#: V1: one upload, then the fused draw and forcing (``dynlogits::watermark_draw_force_``: two Triton
#: kernels, the Philox, Gumbel score and block maxima, then the argmax and the forced rows)
V1_STEADY = 3
#: Model Runner V2: the rows' last ``MAX_HISTORY + width`` tokens read, the context's repeats found and
#: the context absorbed in one fused op (``dynlogits::watermark_window_state``: one kernel), then the
#: same fused draw and forcing over every row of the step (two kernels); with drafts the runner's
#: gathered layout adds its own three ops (the real-row mask, the membership gather)
V2_STEADY = 3
V2_DRAFTS = 6


@pytest.mark.parametrize("rows", [2, 5])
def test_vllm_v1_watermark_step_makes_no_sync_and_a_fixed_number_of_device_ops(rows: int) -> None:
    with SimCuda() as sim:
        alone = drive_v1(sim, Scenario(payloads=[[WATERMARK]] * rows, steps=5, changes=False))
        after_a_ban = drive_v1(sim, Scenario(payloads=[PAYLOAD] * rows, steps=5, changes=False))
    for result in (alone, after_a_ban):
        assert [str(s) for s in result.syncs] == [] and not result.failures
    assert (alone.launches, after_a_ban.launches) == (V1_STEADY, V1_STEADY + 1)


@pytest.mark.parametrize(("drafts", "steady"), [(0, V2_STEADY), (2, V2_DRAFTS)])
@pytest.mark.parametrize("rows", [2, 5])
def test_vllm_model_runner_v2_watermark_step_reads_nothing_back(rows: int, drafts: int, steady: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=[[WATERMARK]] * rows, steps=6, changes=False), drafts=drafts)
    assert [str(s) for s in result.syncs] == [] and not result.failures
    assert result.launches == steady


@pytest.mark.parametrize("runner", ["v1", "v2", "v2-drafts"])
def test_a_sequence_with_batch_changes_and_failing_requests_never_waits(runner: str) -> None:
    with SimCuda() as sim:
        if runner == "v1":
            result = drive_v1(sim, Scenario(payloads=[PAYLOAD] * 2, steps=9))
        else:
            result = drive_v2(sim, Scenario(payloads=[PAYLOAD] * 2, steps=9), drafts=2 if runner == "v2-drafts" else 0)
    assert [str(s) for s in result.syncs] == []

