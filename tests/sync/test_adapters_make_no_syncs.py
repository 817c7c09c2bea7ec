"""Every adapter, driven over a whole sequence as its engine drives it (admissions, removals,
reorders, a request failing on the device, speculative drafts, every built-in kind and a
``python`` kind), on the CUDA model of ``dynlogits.testing.cuda.simcuda``: no step waits for the device,
and the failing request is still reported (its flags are read from a copy that has landed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from dynlogits.testing.cuda.drive import (
    EOS,
    ROW_ENGINES,
    Scenario,
    adapter_counts,
    drive_apply_rows,
    drive_v1,
    drive_v2,
    realizing,
)
from dynlogits.testing.cuda.simcuda import SimCuda

NO_TOKEN_LEFT = "no token left to sample"


@pytest.fixture(autouse=True)
def _allow_python_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", "dynlogits.testing.faults:scale")


def _where(result: Any) -> list[str]:
    return [str(s) for s in result.syncs]


@pytest.mark.parametrize("hosted", [False, True], ids=["built-in kinds", "with a python kind"])
def test_vllm_v1_runner_sequence_never_waits_and_reports_both_failures(hosted: bool) -> None:
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(hosted=hosted))
    assert _where(result) == []
    assert sum(NO_TOKEN_LEFT in f for f in result.failures) == 2  # with and without a stop token


def test_vllm_v1_runner_forced_step_reads_its_forced_ids_from_the_one_upload() -> None:
    """The V1 runner's host knows every row's position, so the host plans each forced row's flat
    index (``ForcedSequenceGroup.plan``) into the positions' upload: the device neither clamps nor
    gathers. A steady step: that upload, the fused settle (``forced_settle_``, two kernels: read,
    test and pick, then mask the rows and write), the copy back of the pick's flag slots (no write
    into the per-slot flags)."""
    forced = [{"kind": "forced_sequence", "token_ids": [5, 6, 7, 8, 9, 10], "eos_token_id": EOS}]
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=[forced] * 3, steps=3, changes=False))
    assert _where(result) == []
    assert result.steady_ops == ["copy_", "forced_settle_", "forced_settle_", "copy_"]


def test_vllm_v1_runner_forced_rows_without_stop_tokens_settle_in_their_group() -> None:
    """Requests without a stop token (``ignore_eos``, as in load tests) settle in the forced group
    too, rather than in a second pass over the rows, in the same fused settle (which rows have a
    stop token to take, and ``-inf`` back onto a masked forced id, decided in its kernels)."""
    forced = [{"kind": "forced_sequence", "token_ids": [5, 6, 7, 8, 9, 10], "eos_token_id": EOS}]
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=[forced] * 3, steps=3, changes=False, ignore_eos=True))
    assert _where(result) == []
    assert result.steady_ops == ["copy_", "forced_settle_", "forced_settle_", "copy_"]


@pytest.mark.parametrize("impl", ["adapter", "adapter_v2"])
def test_a_steady_allowed_tokens_step_takes_at_most_five_launches_and_never_waits(impl: str) -> None:
    """The keep (read the allowed ids, fill the rows, write them back), the dead-row epilogue as
    one fused op (``dynlogits::dead_rows_``: the rows left with no token stopped, their slots
    flagged) and the flags' copy back; 0 syncs over batch changes and a failing request."""
    allowed = [{"kind": "allowed_tokens", "token_ids": [5, 6, 7, 8]}]
    launches, syncs = adapter_counts(impl, 64, [allowed] * 3)
    assert launches <= 5 and syncs == 0, launches
    with SimCuda() as sim:
        drive = drive_v1 if impl == "adapter" else drive_v2
        steady = drive(sim, Scenario(payloads=[allowed] * 3, steps=3, changes=False))
    assert steady.steady_ops == ["index_select", "index_fill_", "index_copy_", "dead_rows_", "copy_"]


def test_vllm_model_runner_v2_sequence_never_waits_and_reports_the_failure() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario())
    assert _where(result) == []
    assert any(NO_TOKEN_LEFT in f for f in result.failures)


def test_vllm_model_runner_v2_with_drafts_never_waits() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(), drafts=2)
    assert _where(result) == []
    assert any(NO_TOKEN_LEFT in f for f in result.failures)


def test_vllm_model_runner_v2_hosted_kind_reads_back_only_its_histories() -> None:
    """A ``python`` processor needs its tokens on the host: reading them is the one sync allowed,
    and only in ``row_histories`` (documented in ``adapters/vllm/v2.py``)."""
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(hosted=True))
    assert result.syncs and all("row_histories" in s.where for s in result.syncs), _where(result)



@pytest.mark.parametrize("engine", sorted(ROW_ENGINES))
def test_row_wise_engines_sequence_never_waits_and_reports_the_failure(engine: str) -> None:
    with SimCuda() as sim:
        result = drive_apply_rows(sim, Scenario(hosted=True), ROW_ENGINES[engine])
    assert _where(result) == []
    assert any(NO_TOKEN_LEFT in f for f in result.failures), result.failures


def test_transformers_reads_back_only_the_generated_ids() -> None:
    """``generate()`` keeps ``input_ids`` on the device and its processors get no host copy: the
    histories' read back is the one sync (``histories_from_ids``)."""
    from dynlogits.adapters.transformers.processor import DynamoLogitsProcessor

    report: list[str] = []
    realize = realizing(report)

    def entry() -> Callable[..., list[str]]:
        def call(logits: torch.Tensor, rows: list[int], payloads: list, histories: list) -> list[str]:
            width = max(len(h) for h in histories)
            ids = torch.zeros(len(rows), 2 + width, dtype=torch.long)
            for r, h in enumerate(histories):
                ids[r, 2 + width - len(h):] = torch.tensor(h, dtype=torch.long)
            proc = DynamoLogitsProcessor(realize(logits, payloads, histories),
                                         [2 + width - len(h) for h in histories])
            out = proc(sim.put(ids), logits)
            logits.copy_(out)
            return report

        return call

    with SimCuda() as sim:
        result = drive_apply_rows(sim, Scenario(hosted=True), entry)
    assert result.syncs and all("histories_from_ids" in s.where or "processor.py" in s.where for s in result.syncs), \
        _where(result)
    assert any(NO_TOKEN_LEFT in f for f in result.failures)
