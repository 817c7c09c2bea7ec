"""``banned_phrases`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: on the V1 runner a resident step that finds no phrase is one masked write (the one-token
phrases' indices are laid out once per batch change: no upload); under Model Runner V2 a steady
step is one fused launch whatever the tokens (``dynlogits::banned_phrases_ban_``: the rows' last
tokens read and compared on the device, the bans written), eight eager device ops where the fused
op is off; and no step of a sequence with batch changes and a failing request waits for the device,
drafts or not, fused or eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dynlogits.processors import banned_phrases
from dynlogits.testing.cuda.drive import Scenario, adapter_counts, drive_v1, drive_v2
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


#: Model Runner V2's steady step: one fused op (``dynlogits::banned_phrases_ban_``: one Triton launch
#: on CUDA, reading the token matrix, the drafts and the group's tables itself)
V2_STEADY = ["banned_phrases_ban_"]
#: the same step where the fused op is off (a CUDA device whose probe failed): the rows' last
#: tokens' flat indices and output lengths (``add``), the tokens read (``take``), each entry's
#: matching cells counted (``eq``, ``sum``), an entry hits where ``min(count, length) == need``
#: (``minimum``, ``eq``), and one masked write (``where``, ``scatter_reduce_``)
V2_STEADY_EAGER = ["add", "take", "eq", "sum", "minimum", "eq", "where", "scatter_reduce_"]
FINDS_IDS = [[{"kind": "banned_phrases", "phrases": [[62]] + [[t, 63] for t in range(62)]}]] * 2


class _Off:
    """A gate that never runs the fused op (``FusedGate``'s answer on a device whose probe failed)."""

    probed = False

    def ready(self, device: object) -> bool:
        return self.probed

    def run(self, device: object, fused: object, eager: Callable[[], None]) -> None:
        eager()

    def run_named(self, device: object, fused: object, eager: Callable[[], None], *named: object) -> None:
        eager()


class _FailsToCompile(_Off):
    """A gate whose probe passed but whose kernel variant fails at its first call (``FusedGate.run``
    answers with the eager path)."""

    probed = True


@pytest.fixture(params=[_Off, _FailsToCompile], ids=["probe-failed", "variant-failed"])
def fused_off(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(banned_phrases, "GATE", request.param())


@pytest.mark.parametrize("payloads", [PHRASES, FINDS_IDS], ids=["finds-nothing", "finds-ids"])
def test_vllm_model_runner_v2_phrase_step_is_one_fused_launch_and_reads_nothing_back(payloads) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=payloads, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == V2_STEADY and steady.launches == 1


@pytest.mark.parametrize("payloads", [PHRASES, FINDS_IDS], ids=["finds-nothing", "finds-ids"])
def test_vllm_model_runner_v2_phrase_step_without_the_fused_op_is_eight_eager_device_ops(payloads, fused_off) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=payloads, steps=3, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == V2_STEADY_EAGER


@pytest.mark.parametrize("payloads", [PHRASES, FINDS_IDS], ids=["finds-nothing", "finds-ids"])
def test_vllm_model_runner_v2_phrase_workload_launches_at_most_one_op_a_step_and_never_syncs(payloads) -> None:
    assert adapter_counts("adapter_v2", 64, payloads) == (1, 0)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_phrase_sequence_never_waits_and_reports_the_failures(
        drafts: int, fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not fused:
        monkeypatch.setattr(banned_phrases, "GATE", _Off())
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=PHRASES, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)

