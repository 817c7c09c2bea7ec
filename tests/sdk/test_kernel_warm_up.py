"""The fused kernels are probed at engine load (``dynlogits.sdk.resident.warm``), not in the step
whose batch first holds a kind: ``SlotBatch`` on a CUDA device probes every registered gate before
it allocates anything. No CUDA here: the gates probed are the test's own (a CUDA ``torch.device``
is only a name until a tensor is put on it)."""

from __future__ import annotations

import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import dynlogits
from dynlogits.kernels import probe as probe_module
from dynlogits.kernels.probe import FusedGate
from dynlogits.sdk import SlotBatch
from dynlogits.sdk.resident import slot_batch, warm
from dynlogits.sdk.resident.warm import WARM_ENV

CUDA = torch.device("cuda", 0)


@pytest.fixture
def own_gates(monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.device], list[FusedGate]]:
    """Only two test gates registered (each recording its probes; the second's kernels differ), and
    no module imported by the warm-up (the real gates would probe a CUDA device this machine lacks)."""
    monkeypatch.setattr(probe_module, "_GATES", weakref.WeakSet())
    monkeypatch.setattr(warm, "import_gate_modules", lambda: None)
    monkeypatch.delenv(WARM_ENV, raising=False)
    probed: list[torch.device] = []

    def recorded(answer: bool):  # noqa: ANN202
        def run(device: torch.device) -> bool:
            probed.append(device)
            return answer
        return run

    return probed, [FusedGate("a kind", recorded(True)), FusedGate("b kind", recorded(False))]


def test_warm_probes_every_registered_gate_once_and_first_use_reads_the_cached_answer(own_gates) -> None:  # noqa: ANN001
    probed, made = own_gates
    assert warm.warm(CUDA) == {"a kind": True, "b kind": False}
    assert probed == [CUDA, CUDA]
    assert [gate.ready(CUDA) for gate in made] == [True, False] and len(probed) == 2  # no probe at first use


def test_warm_does_nothing_off_cuda_or_when_the_operator_turns_it_off(own_gates, monkeypatch) -> None:  # noqa: ANN001
    probed, _ = own_gates
    assert warm.warm(torch.device("cpu")) is None and warm.warm(torch.device("meta")) is None
    monkeypatch.setenv(WARM_ENV, "0")
    assert warm.warm(CUDA) is None
    assert probed == []


def test_a_slot_batch_made_on_cuda_probes_the_kernels_before_it_allocates(own_gates, monkeypatch) -> None:  # noqa: ANN001
    probed, _ = own_gates
    allocated: list[str] = []
    monkeypatch.setattr(slot_batch, "SlotTable", lambda *a, **k: allocated.append("table") or (_ for _ in ()).throw(
        RuntimeError("stop after the warm-up")))
    with pytest.raises(RuntimeError, match="stop after the warm-up"):
        SlotBatch(num_slots=4, vocab_size=16, device="cuda:0")
    assert probed == [CUDA, CUDA] and allocated == ["table"]  # probed first, then the first table


def test_a_slot_batch_on_the_cpu_probes_nothing(own_gates) -> None:  # noqa: ANN001
    probed, _ = own_gates
    SlotBatch(num_slots=4, vocab_size=16, device="cpu")
    assert probed == []


def test_the_warm_up_imports_every_gate_the_package_defines() -> None:
    """In a fresh interpreter, the gates registered after ``import_gate_modules`` are every
    ``FusedGate("name", ...)`` written in ``dynlogits.kernels`` and ``dynlogits.processors``."""
    root = Path(dynlogits.__file__).parent
    written = {name for package in ("kernels", "processors") for path in (root / package).glob("*.py")
               for name in re.findall(r'FusedGate\("([^"]+)"', path.read_text())}
    code = ("from dynlogits.sdk.resident.warm import import_gate_modules; from dynlogits.kernels.probe import gates; "
            "import_gate_modules(); print('\\n'.join(g.name for g in gates()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert len(written) >= 9 and set(out.splitlines()) == written
