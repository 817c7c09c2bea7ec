"""``no_repeat_ngram`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: on the V1 runner a resident step that finds ids is one upload and one masked write (the
rows decided on the host from their histories); under Model Runner V2 every row is decided on the
device from the engine's token matrix, a fixed number of ops whatever the tokens
(``V2_STEADY``, ``V2_STEADY_OPS_WITH_DRAFTS``), with drafts or without; and no step of a sequence with batch changes and
failing requests waits for the device on either runner."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

#: no ``include_prompt``: the CUDA model's V2 runner stages no prompt (such a request fails at admission)
ONE_SIZE: list[list[dict[str, Any]]] = [[{"kind": "no_repeat_ngram", "size": 3}]] * 2
MIXED: list[list[dict[str, Any]]] = [[{"kind": "no_repeat_ngram", "size": 2}],
                                     [{"kind": "banned_tokens", "token_ids": [0]}, {"kind": "no_repeat_ngram", "size": 3}],
                                     [{"kind": "no_repeat_ngram", "size": 1}]]

#: ``include_prompt`` where the runner staged no write of the prompt (the CUDA model's V2 runner):
#: the host cannot index the prompt, so realization refuses the entry (``no_repeat_ngram.factory``)
INCLUDING_PROMPT: list[list[dict[str, Any]]] = [[{"kind": "no_repeat_ngram", "size": 3, "include_prompt": True}]] * 2

#: Model Runner V2's steady step, one size in the group (``no_repeat_ngram_device``): the rows'
#: decisions and bans in one fused op (``dynlogits::no_repeat_ngram_ban_``: one Triton launch on
#: CUDA, reading the token matrix, the drafts and the layout's per-slot params itself)
V2_STEADY = ["no_repeat_ngram_ban_"]
#: the same step with two drafts per request: the adapter's rows for the step's new row mapping
#: (``SlotBatch.rows_on_device``'s upload ``_to_copy``, the V2 adapter's ``eq``, the group's
#: membership gathered again: ``index``) and the fused op
V2_STEADY_OPS_WITH_DRAFTS = 4


def test_vllm_v1_runner_step_that_finds_ids_is_one_upload_and_one_masked_write() -> None:
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(vocab=4, payloads=[MIXED[0]] * 2, steps=8, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == ["copy_", "index_fill_"]


def test_vllm_v1_runner_sequence_never_waits_and_reports_the_failures() -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(vocab=32, payloads=MIXED, steps=12))
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)


@pytest.mark.parametrize("vocab", [4, 64])  # 4: every step finds ids; 64: few do
def test_vllm_model_runner_v2_step_is_decided_on_the_device_and_reads_nothing_back(vocab: int) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=vocab, payloads=ONE_SIZE, steps=8, changes=False))
    assert [str(s) for s in steady.syncs] == []
    assert steady.steady_ops == V2_STEADY and steady.failures == []


def test_vllm_model_runner_v2_step_with_drafts_reads_nothing_back() -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=4, payloads=ONE_SIZE, steps=8, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == []
    assert steady.launches == V2_STEADY_OPS_WITH_DRAFTS
    assert steady.steady_ops[-len(V2_STEADY):] == V2_STEADY and steady.failures == []


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_sequence_never_waits_and_reports_the_failures(drafts: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=32, payloads=MIXED, steps=12), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)


def _unstaged_prompt_run(drafts: int = 0) -> tuple[list[str], list[str]]:
    with SimCuda() as sim:  # drafts from the fifth step on (``drive_v2``)
        result = drive_v2(sim, Scenario(vocab=32, payloads=INCLUDING_PROMPT, steps=8 if drafts else 4, changes=False),
                          drafts=drafts)
    return [str(s) for s in result.syncs], result.failures


def test_vllm_model_runner_v2_include_prompt_without_a_staged_prompt_is_refused_at_admission() -> None:
    _, failures = _unstaged_prompt_run()
    assert len(failures) == len(INCLUDING_PROMPT)
    assert all("include_prompt needs the request's prompt" in f for f in failures)


def test_vllm_model_runner_v2_request_refused_at_admission_reads_nothing_back() -> None:
    syncs, _ = _unstaged_prompt_run()
    assert syncs == []


def test_vllm_model_runner_v2_request_refused_at_admission_reads_nothing_back_with_drafts() -> None:
    syncs, failures = _unstaged_prompt_run(drafts=2)
    assert len(failures) == len(INCLUDING_PROMPT)
    assert syncs == []
