"""``multiple_choice`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: under Model Runner V2 each row's first generated tokens are read and compared with its
slot's choices on the device (``MultipleChoiceGroup``), a fixed number of device ops a step (11 its
own, 2 the restrictive groups' epilogue: the fused dead_rows_ and the flags' copy back) and no read back; on the V1 runner each row's processor
decides on the host and the rows' allowed ids go up in one upload. No step of a sequence with batch changes and a failing request waits for the device."""

from __future__ import annotations

import pytest

from dynlogits.testing.cuda.drive import EOS, Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

CHOICES = [[{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": EOS}],
           [{"kind": "multiple_choice", "choices": [[9, 9, 9]], "eos_token_id": EOS}]]
#: the steady step's own device ops: the rows' generated counts (``sub``, ``StepInputs.generated``:
#: a row left with no token reports its position), their first generated tokens read (``take``, the
#: flat indices fixed per layout), each entry's cells equal to them counted (``eq``, ``sum``), an
#: entry matches where ``clamp(pos, low, high) + BIG * count`` is its target (``clamp``, ``add``,
#: ``eq``), and the keep: the entries' logits read, the unmatched ones ``-inf`` (``gather``,
#: ``where``), the member rows filled and the read ones written back (``masked_fill_``,
#: ``scatter_reduce_``)
V2_STEADY_OWN = ["sub", "take", "eq", "sum", "clamp", "add", "eq", "gather", "where", "masked_fill_", "scatter_reduce_"]
#: then what every restrictive group ends with (the rows left with no token, their flags: ``slots.py``)
V2_STEADY_EPILOGUE = 2


def test_vllm_model_runner_v2_choice_step_is_a_fixed_number_of_device_ops_and_reads_nothing_back() -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=CHOICES, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops[:len(V2_STEADY_OWN)] == V2_STEADY_OWN
    assert len(steady.steady_ops) == len(V2_STEADY_OWN) + V2_STEADY_EPILOGUE


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
