"""Fused ops (``dynlogits.kernels.fused``) on the CUDA model: an op of the ``dynlogits`` namespace
reaches ``SimCuda`` as one op through the Python dispatch key, counts the kernels it declares (not
its inner eager ops, not one), and runs its CPU implementation on the unwrapped tensors."""

from __future__ import annotations

import pytest
import torch

from dynlogits.kernels.fused import declared_launches, fused_op, registered
from dynlogits.testing.cuda.simcuda import SimCuda


@fused_op("test_three_launches_", launches=3, mutates_args=("out",))
def _three(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Eight eager ops: what SimCuda must not count."""
    y = x
    for _ in range(7):
        y = y * 2
    out.copy_(y)
    return y + 1


def test_simcuda_counts_a_fused_ops_declared_launches_and_runs_its_cpu_implementation() -> None:
    with SimCuda() as sim:
        x = sim.put(torch.arange(4.0))
        out = sim.put(torch.zeros(4))
        before = sim.launches
        y = _three(x, out)
        launched = sim.launches - before
    assert launched == 3 and sim.ops[-3:] == ["test_three_launches_"] * 3 and not sim.syncs
    assert torch.equal(sim.value(y), torch.arange(4.0) * 128 + 1)
    assert torch.equal(sim.value(out), torch.arange(4.0) * 128)  # the mutation reached the device tensor


def test_declared_launches_answers_registered_ops_only() -> None:
    assert declared_launches(torch.ops.dynlogits.test_three_launches_.default) == 3
    assert declared_launches(torch.ops.aten.add.Tensor) is None
    assert "dynlogits::test_three_launches_" in registered()


def test_the_watermark_ops_declare_the_kernels_their_cuda_implementations_launch() -> None:
    import dynlogits.processors.watermark_compiled  # noqa: F401  # declares them

    ops = registered()
    assert ops["dynlogits::watermark_draw_force_"].launches == 2  # draw_blocks, draw_reduce
    assert ops["dynlogits::watermark_absorb"].launches == 1  # absorb_rows


def test_a_cuda_device_whose_probe_fails_falls_back_to_eager_with_one_warning(monkeypatch, caplog) -> None:  # noqa: ANN001
    from dynlogits.processors import watermark_compiled as wc

    calls = []

    def failing(device: torch.device) -> bool:
        calls.append(device)
        raise ImportError("no module named triton")

    monkeypatch.setattr(wc, "_probe", failing)
    wc.reset_fused()
    try:
        with caplog.at_level("WARNING", logger="dynlogits.kernels"):
            answers = [wc.fused_ready(torch.device("cuda", 0)) for _ in range(3)]
        assert answers == [False] * 3 and len(calls) == 1  # probed once per device
        assert sum("fused Triton kernels are off" in r.getMessage() for r in caplog.records) == 1
        assert wc.fused_ready(torch.device("cpu")) is False and wc.fused_ready(torch.device("meta")) is True
    finally:
        wc.reset_fused()


def test_a_fused_call_that_fails_on_cuda_turns_the_kernels_off_and_answers_eagerly(caplog) -> None:  # noqa: ANN001
    """A kernel variant the probe did not compile fails at its first call: that call and every later
    one on the device run eagerly, with one warning; in the CUDA model an error propagates."""
    from dynlogits.kernels.probe import FusedGate

    gate = FusedGate("kind", lambda device: True)
    cuda = torch.device("cuda", 0)
    calls: list[str] = []

    def fused() -> str:
        calls.append("fused")
        raise RuntimeError("CompilationError: at 12:4\nmore")

    def eager() -> str:
        calls.append("eager")
        return "eager"

    with caplog.at_level("WARNING", logger="dynlogits.kernels"):
        answers = [gate.run(cuda, fused, eager) for _ in range(3)]
    assert answers == ["eager"] * 3 and calls == ["fused", "eager", "eager", "eager"]
    assert gate.ready(cuda) is False
    warned = [r.getMessage() for r in caplog.records if "fused Triton kernels are off" in r.getMessage()]
    assert len(warned) == 1 and "CompilationError: at 12:4" in warned[0] and "more" not in warned[0]
    assert gate.run(torch.device("cpu"), fused, eager) == "eager"  # the CPU never takes the kernels
    with pytest.raises(RuntimeError):
        FusedGate("kind", lambda device: True).run(torch.device("meta"), fused, eager)
