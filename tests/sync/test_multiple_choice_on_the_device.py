"""``multiple_choice`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: under Model Runner V2 each row's first generated tokens are read and compared with its
slot's choices on the device (``MultipleChoiceGroup``), a fixed number of device ops a step and no
read back; on the V1 runner each row's processor decides on the host and the rows' allowed ids go up
in one upload. No step of a sequence with batch changes and a failing request waits for the device."""

from __future__ import annotations

import pytest

from dynlogits.testing.cuda.drive import EOS, Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

CHOICES = [[{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": EOS}],
           [{"kind": "multiple_choice", "choices": [[9, 9, 9]], "eos_token_id": EOS}]]
#: the steady step's device ops: the rows' positions and first tokens read, compared with every entry
#: of their slots and the matching entries' ids kept (24), then what every restrictive group ends with
#: (the rows left with no token, their flags: 14)
V2_STEADY_OPS = 38


def test_vllm_model_runner_v2_choice_step_is_a_fixed_number_of_device_ops_and_reads_nothing_back() -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=CHOICES, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert len(steady.steady_ops) == V2_STEADY_OPS and "scatter_reduce_" in steady.steady_ops


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_choice_sequence_never_waits_and_reports_the_failures(drafts: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=CHOICES, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)


def test_vllm_v1_runner_choice_step_is_one_upload_and_a_keep_and_sequences_never_wait() -> None:
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=CHOICES, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    # the rows' positions and their allowed ids go up (two uploads), then the keep: read, fill the rows, write back
    assert steady.steady_ops[:5] == ["copy_", "copy_", "index_select", "index_fill_", "index_copy_"]
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=CHOICES, steps=9))
    assert [str(s) for s in result.syncs] == []
    assert sum("no token left to sample" in f for f in result.failures) == 2
