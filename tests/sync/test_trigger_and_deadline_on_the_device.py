"""``trigger`` and ``deadline`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives
the adapter. On the V1 runner their resident step (decided on the host) uploads the firing rows'
tokens and forces them; under Model Runner V2 a trigger is followed on the device from the engine's
token matrix (``TriggerTables``), so no step reads a history back, whether it fires or not, with
drafts or without. No step of a sequence with batch changes and a failing request waits for the
device (``deadline`` under V2: tests/sync/test_deadline_on_the_device.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

# the bias makes the trigger (two 5s) certain, so the phrase is forced during the sequence
TRIGGERS: list[list[dict[str, Any]]] = [[{"kind": "logit_bias", "bias": {"5": 100.0}}, {"kind": "trigger", "trigger_token_ids": [5, 5],
                                                             "phrase_token_ids": [7, 8, 9]}],
            [{"kind": "trigger", "trigger_token_ids": [11], "phrase_token_ids": [12]}]]
DEADLINES: list[list[dict[str, Any]]] = [[{"kind": "deadline", "seconds": 0.001}], [{"kind": "deadline", "seconds": 3600}]]


@pytest.mark.parametrize("payloads", [TRIGGERS, DEADLINES, TRIGGERS + DEADLINES], ids=["trigger", "deadline", "both"])
def test_vllm_v1_runner_sequence_never_waits_and_reports_the_failures(payloads: list) -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=payloads, steps=9))
    assert [str(s) for s in result.syncs] == []
    assert sum("no token left to sample" in f for f in result.failures) == 2


def test_vllm_v1_runner_steps_that_force_nothing_cost_one_upload() -> None:
    """A steady step of deadlines not yet due: only the positions' upload (no row is touched)."""
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=DEADLINES[1:] * 2, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == [] and steady.steady_ops == ["copy_"]


def test_vllm_v1_runner_forcing_step_uploads_the_firing_rows_and_forces_them() -> None:
    """A steady step where both triggers force: the bias, then one upload of the firing rows and
    their tokens, the forcing (read the forced ids, mask the rows, write them back) and the check
    that each kept a token."""
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=TRIGGERS[:1] * 2, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops[:3] == ["copy_", "index_add_", "copy_"] and ops.count("index_fill_") == 1 and ops[-2:] == ["dead_rows_", "copy_"]


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("payloads", [TRIGGERS, TRIGGERS[1:] * 2], ids=["fires", "never-fires"])
def test_vllm_model_runner_v2_trigger_never_reads_a_history_back(payloads: list, drafts: int) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=payloads, steps=4, changes=False), drafts=drafts)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops  # the trigger's work runs on the device
    # the delimiters' right-aligned tables and the window's offsets are made at a batch change and
    # kept (``SpanTables.matcher``/``offsets``), not remade at every span advance
    assert "arange" not in steady.steady_ops
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=payloads, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)


#: a steady step of triggers that never fire: the span advanced and each slot's phrase token decided
#: in one fused ``spans_advance_`` (the window read inside it), the positions (listed.py), the rows'
#: decisions read off it (``index``, ``where``), the forcing and settle in one fused
#: ``decided_settle_`` (no later group masks the rows) and the copy of its per-row flags
V2_STEADY_OPS = 6


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_trigger_steady_step_is_a_fixed_number_of_device_ops(drafts: int) -> None:
    """With or without a speculative config (its steady step follows three rounds: one fused op)."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=TRIGGERS[1:] * 2, steps=4, changes=False), drafts=drafts)
    assert [str(s) for s in steady.syncs] == [] and len(steady.steady_ops) == V2_STEADY_OPS
    assert steady.steady_ops == ["spans_advance_", "sub", "index", "where", "decided_settle_", "copy_"]
