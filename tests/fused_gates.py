"""A kind's ``FusedGate`` (``dynlogits.kernels.probe``) checked the same way for every kernel module:
a probe that finds the kernel differing from its reference turns the kernels off on that device,
probed once, with one warning naming the kind, and ``run`` answers with the eager path."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch


def a_failed_probe_falls_back(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, module: ModuleType,
                              probe: str, kind: str) -> None:
    """``module.GATE`` with ``module.<probe>`` answering that the kernel differs: three ``ready``
    calls on one CUDA device probe once and answer no, ``run`` takes the eager path, one warning
    starts with ``kind``; the CPU never runs the kernels, another device (the CUDA model) always."""
    probed: list[torch.device] = []

    def differing(device: torch.device) -> bool:
        probed.append(device)
        return False  # the kernel's result differs from its reference's

    monkeypatch.setattr(module, probe, differing)
    gate = module.GATE
    gate.reset()
    try:
        with caplog.at_level("WARNING", logger="dynlogits.kernels"):
            answers = [gate.ready(torch.device("cuda", 0)) for _ in range(3)]
            ran = gate.run(torch.device("cuda", 0), lambda: "fused", lambda: "eager")
        assert answers == [False] * 3 and len(probed) == 1 and ran == "eager"  # probed once per device
        warned = [r.getMessage() for r in caplog.records if "fused Triton kernels are off" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith(kind)
        assert gate.ready(torch.device("cpu")) is False and gate.ready(torch.device("meta")) is True
    finally:
        gate.reset()


def count_choice_steps(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``multiple_choice``'s gate opened on the CPU (its fused op's CPU implementation runs) and each
    call of the op recorded: whether it read drafts (``input_ids`` given)."""
    from dynlogits.kernels.multiple_choice import GATE
    from dynlogits.processors import multiple_choice as mc

    drafted: list[bool] = []
    op = mc.multiple_choice_keep_

    def counted(*args: object) -> None:
        drafted.append(args[10] is not None)  # input_ids
        op(*args)

    monkeypatch.setattr(GATE, "ready", lambda device: True)
    monkeypatch.setattr(mc, "multiple_choice_keep_", counted)
    return drafted
