"""``dynlogits.testing.cuda.check`` (run on a GPU by hand; see docs/vllm.md) keeps working here: its
sequence runs on the CPU and on the CUDA model (``dynlogits.testing.cuda.simcuda``), replays bit for bit
and reports both failing requests with no call an engine would not make (no synchronize, no extra
apply, no poll: the model's device catches up only between steps and once idle); its failure
sequences report once each and each of its mutants is caught on the CUDA model; its comparison names
a planted difference; without CUDA it refuses with exit status 2."""

from __future__ import annotations

import logging

import pytest
import torch

from dynlogits.testing.cuda import check as cuda_check
from dynlogits.testing.cuda.simcuda import SimCuda


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


def test_on_the_cuda_model_the_sequence_replays_and_reports_both_failures_with_no_sync() -> None:
    cpu = torch.device("cpu")
    reference = cuda_check.run_sequence(cpu, dtype=torch.float32, replay=None)
    with SimCuda() as sim:
        got = cuda_check.run_sequence(sim.device, dtype=torch.float32, replay=reference,
                                      model=cuda_check.DeviceModel(sim.put, sim.advance, sim.value))
    assert [str(s) for s in sim.syncs] == []
    assert cuda_check.compare(reference, got) == []
    assert sum(cuda_check.NO_TOKEN_LEFT in f for f in got.failures) == 2


def test_on_the_cuda_model_every_failure_sequence_reports_once_and_every_mutant_is_caught() -> None:
    logging.getLogger("dynlogits").setLevel(logging.CRITICAL)
    try:
        with SimCuda() as sim:
            results = cuda_check.failure_checks(sim.device, cuda_check.DeviceModel(sim.put, sim.advance, sim.value))
    finally:
        logging.getLogger("dynlogits").setLevel(logging.NOTSET)
    assert [r["sequence"] for r in results if not r["ok"]] == []
    assert sum(r["sequence"].startswith("mutant") for r in results) == 2 * len(cuda_check.MUTANTS)
    assert [str(s) for s in sim.syncs] == []


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


def test_every_kernel_check_it_runs_exists_with_a_gpu_run_and_a_cpu_self_test() -> None:
    """``check`` runs each kind's fused-kernel check by name: a renamed module or function must fail
    here, not on the first GPU a session gets."""
    import importlib
    import inspect

    assert cuda_check.KERNEL_CHECKS  # the watermark's is its own section; the others are listed
    for name, (run, cpu) in cuda_check.KERNEL_CHECKS.items():
        module = importlib.import_module(f"dynlogits.testing.cuda.{name}")
        assert "device" in inspect.signature(getattr(module, run)).parameters, name
        assert callable(getattr(module, cpu)), name
