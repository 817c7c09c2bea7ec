"""``dynlogits.bench.cuda_check`` (run on a GPU by hand; see docs/vllm.md) keeps working here: its
sequence runs on the CPU, replays bit for bit, reports both failing requests, and its comparison
names a planted difference; without CUDA it refuses with exit status 2."""

from __future__ import annotations

import pytest
import torch

from dynlogits.bench import cuda_check


@pytest.fixture(autouse=True)
def _allow_python_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", "dynlogits.testing.faults:scale")


def test_the_sequence_replays_bit_for_bit_and_reports_both_failures() -> None:
    cpu = torch.device("cpu")
    reference = cuda_check.run_sequence(cpu, dtype=torch.bfloat16, replay=None)
    replayed = cuda_check.run_sequence(cpu, dtype=torch.bfloat16, replay=reference)
    assert cuda_check.compare(reference, replayed) == []
    assert sum(cuda_check.NO_TOKEN_LEFT in f for f in replayed.failures) == 2
    assert len(reference.failing) == 2 and max(len(r) for r in reference.rows) > 24  # more rows than slots: some hosted


def test_the_comparison_names_a_planted_difference() -> None:
    cpu = torch.device("cpu")
    reference = cuda_check.run_sequence(cpu, dtype=torch.float32, replay=None, steps=6)
    replayed = cuda_check.run_sequence(cpu, dtype=torch.float32, replay=reference, steps=6)
    replayed.logits[4][0, 5] += 1.0
    assert cuda_check.compare(reference, replayed) == ["step 4 row 0 (request 2): differs at ids [5]"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_refuses_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cuda_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
