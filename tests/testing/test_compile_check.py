"""``dynlogits.testing.cuda.compile_check``, the GPU check that no step compiles a kernel: its
recording of Triton's compiles and its sweep run here on the CPU (no compile happens on a CPU; the
compiles are planted where a GPU's would be noted)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from dynlogits import sdk
from dynlogits.testing.cuda import compile_check
from dynlogits.testing.cuda.compile_check import Compile

triton_jit = pytest.importorskip("triton.runtime.jit")


def test_recorded_notes_each_compile_with_its_thread_and_puts_the_method_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def stub(self: Any, *args: Any, **kwargs: Any) -> str:
        return "compiled"

    monkeypatch.setattr(triton_jit.JITFunction, "_do_compile", stub)
    kernel = type("ban_rows", (), {"__name__": "ban_rows"})()
    with compile_check.recorded() as seen:
        assert triton_jit.JITFunction._do_compile(kernel, "key") == "compiled"
        worker = threading.Thread(target=lambda: triton_jit.JITFunction._do_compile(kernel), name="dynlogits-compile")
        worker.start()
        worker.join(timeout=30)
    assert seen == [Compile("ban_rows", threading.current_thread().name), Compile("ban_rows", "dynlogits-compile")]
    assert triton_jit.JITFunction._do_compile is stub


def test_a_sweep_realizes_every_workload_resident_and_sorts_compiles_by_their_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workload realizes resident and runs through a real ``SlotBatch`` (CPU); a compile noted
    on the sweeping thread during a step is in the step, one noted on the compile thread is off it.
    Steps come in order: workloads, then batches, then steps (one dtype here)."""
    seen: list[Compile] = []
    me = threading.current_thread().name
    names = list(compile_check.WORKLOADS)
    slots = sdk.SlotBatch(num_slots=3, vocab_size=1000, device=torch.device("cpu"), host_histories=True)
    real_apply = slots.apply
    calls: list[int] = []
    planted = {4 * names.index("multiple_choice 12"): Compile("keep_rows", me),
               4 * names.index("watermark 9") + 2: Compile("window_decide", "dynlogits-compile")}

    def apply(logits: torch.Tensor, step: Any) -> None:
        if len(calls) in planted:
            seen.append(planted[len(calls)])
        calls.append(logits.shape[0])
        real_apply(logits, step)

    monkeypatch.setattr(slots, "apply", apply)
    result = compile_check.sweep(slots, torch.device("cpu"), 1000, seen, batches=(1, 2), steps=2,
                                 dtypes=(torch.float32,))
    assert calls == [1, 1, 2, 2] * len(names) and result.steps == len(calls)
    assert result.in_step == ["multiple_choice 12 / batch 1 / float32: keep_rows"]
    assert result.off_step == ["watermark 9 / batch 2 / float32: window_decide"]
