"""``dry`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the adapter. On the V1
runner a resident step that penalizes is six device ops (one upload of the flat indices and the
amounts, a read, the subtraction kept finite, a write back), one that penalizes nothing none; under
Model Runner V2 every row is decided on the device from the token window by one fused op
(``dry_device.fused_lower_``: a Triton kernel and ``scatter_reduce_`` on CUDA, two launches whatever
the tokens, ``V2_STEADY_OPS``), with drafts or without. No step of a sequence with batch
changes and failing requests waits for the device on either runner."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

#: no breakers: text breakers need the engine's tokenizer, which the CUDA model's config has not
DRY: list[list[dict[str, Any]]] = [[{"kind": "dry", "multiplier": 0.8, "sequence_breakers": []}],
       [{"kind": "dry", "multiplier": 2.0, "base": 1.5, "allowed_length": 1, "penalty_last_n": 8, "sequence_breakers": []}],
       [{"kind": "banned_tokens", "token_ids": [0]}, {"kind": "dry", "multiplier": 1.0, "include_prompt": False,
                                                       "sequence_breakers": []}]]

#: the upload (flat indices, then the amounts packed in the logits' dtype), the rows' values read,
#: lowered, kept finite (``-inf`` kept), written back
V1_STEADY = ["copy_", "index_select", "sub", "clamp_max", "maximum", "index_copy_"]


@pytest.mark.parametrize("seed", range(3))
def test_vllm_v1_runner_dry_step_that_penalizes_is_six_device_ops_and_reads_nothing_back(seed: int) -> None:
    # four ids: the argmax histories repeat within the steps, so the last step penalizes
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(vocab=4, payloads=DRY[:2], steps=16, changes=False, seed=seed))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == V1_STEADY
    assert steady.failures == []


def test_vllm_v1_runner_dry_step_that_penalizes_nothing_queues_nothing() -> None:
    # a 64-wide row and 3 steps: no history of two tokens repeats yet
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(vocab=64, payloads=DRY[:1], steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == []


def test_vllm_v1_runner_dry_sequence_never_waits_and_reports_the_failures() -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(vocab=32, payloads=DRY, steps=16))
    assert [str(s) for s in result.syncs] == []
    assert sum("no token left to sample" in f for f in result.failures) == 2


#: Model Runner V2's steady step for ``DRY[:2]``, without drafts and with two: the group's fused op
#: (its two declared launches: the kernel deciding every position's id and lowered value from the
#: window, the drafts from ``input_ids``, then ``scatter_reduce_``); with drafts the adapter's own
#: three ops before it
V2_STEADY_OPS = {0: 2, 2: 5}


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_dry_step_is_decided_on_the_device_and_reads_nothing_back(drafts: int) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=4, payloads=DRY[:2], steps=16, changes=False), drafts=drafts)
    assert [str(s) for s in steady.syncs] == []
    assert steady.launches == V2_STEADY_OPS[drafts]
    assert steady.steady_ops[-2:] == ["dry_lower_", "dry_lower_"] and steady.failures == []


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_dry_sequence_never_waits(drafts: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=32, payloads=DRY, steps=16), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)
