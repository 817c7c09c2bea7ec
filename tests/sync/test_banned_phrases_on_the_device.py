"""``banned_phrases`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: on the V1 runner a resident step that finds no phrase is one masked write (the one-token
phrases' indices are laid out once per batch change: no upload); under Model Runner V2 a steady
step is eight device ops whatever the tokens (the rows' last tokens read and compared on the
device); and no step of a sequence with batch changes and a failing request waits for the device."""

from __future__ import annotations

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

PHRASES = [[{"kind": "banned_phrases", "phrases": [[9], [5, 6], [6, 5, 8], [3, 3]]}],
           [{"kind": "banned_phrases", "phrases": [[4, 4], [12, 4, 4, 4]]}]]


def test_vllm_v1_runner_phrase_step_that_finds_nothing_is_one_masked_write_and_no_upload() -> None:
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=PHRASES, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == ["index_fill_"]


def test_vllm_v1_runner_phrase_sequence_never_waits_and_reports_the_failures() -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=PHRASES, steps=9))
    assert [str(s) for s in result.syncs] == []
    assert sum("no token left to sample" in f for f in result.failures) == 2


def test_vllm_v1_runner_phrase_step_that_finds_ids_is_one_upload_and_one_masked_write() -> None:
    # every token but 62 and 63 begins a phrase ending in 63, so every step after the first finds 63
    every = [[{"kind": "banned_phrases", "phrases": [[62]] + [[t, 63] for t in range(62)]}]] * 2
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=every, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == ["copy_", "index_fill_"]


#: Model Runner V2's steady step: the rows' last tokens' flat indices and output lengths (``add``),
#: the tokens read (``take``), each entry's matching cells counted (``eq``, ``sum``), an entry hits
#: where ``min(count, length) == need`` (``minimum``, ``eq``), and one masked write (``where``,
#: ``scatter_reduce_``).
V2_STEADY = ["add", "take", "eq", "sum", "minimum", "eq", "where", "scatter_reduce_"]


@pytest.mark.parametrize("payloads", [PHRASES, [[{"kind": "banned_phrases", "phrases": [[62]] + [[t, 63] for t in range(62)]}]] * 2],
                         ids=["finds-nothing", "finds-ids"])
def test_vllm_model_runner_v2_phrase_step_is_eight_device_ops_and_reads_nothing_back(payloads) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=payloads, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == V2_STEADY


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_phrase_sequence_never_waits_and_reports_the_failures(drafts: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=PHRASES, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)

