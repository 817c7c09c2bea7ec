"""``watermark`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM's runners drive the
adapter: it runs hosted (per row, after the request's resident entries). The processor itself never
synchronizes: the context is absorbed on the host from the history (a host list) and the draw and
the forcing stay on the device. Under the V1 runner the histories are host lists, so a step makes
no sync at all; under Model Runner V2 the hosted path reads the rows' histories back from the
runner's device token matrix, and those reads are the only syncs (none is the watermark's)."""

from __future__ import annotations

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")

PAYLOAD = [{"kind": "banned_tokens", "token_ids": [3]}, {"kind": "watermark", "key": 2**64 - 5, "context_width": 4}]


def test_vllm_v1_watermark_steps_make_no_sync() -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=[PAYLOAD] * 2, steps=5, changes=False))
    assert [str(s) for s in result.syncs] == [] and not result.failures


def test_vllm_model_runner_v2_syncs_only_to_read_histories_never_in_the_watermark() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=[PAYLOAD] * 2, steps=5, changes=False))
    assert not result.failures
    assert not [str(s) for s in result.syncs if "watermark" in s.where], result.syncs
