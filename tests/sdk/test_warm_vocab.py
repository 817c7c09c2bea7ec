"""The warm-up compiles the variant an engine's vocabulary selects: the watermark draw's
``draw_reduce`` takes a constexpr from the logits' width (``NB``: its block count's power of two),
and both draw kernels key their logits' stride, width and address (vector loads), so the gate's
probe (a small vocabulary) leaves the engine's variant to its first step unless ``warm(device,
vocab)`` compiles it (``compile_for_vocab``). Triton's keys are recorded in its
interpreter (``TRITON_INTERPRET=1``, a subprocess; ``dynlogits.testing.cuda.specialization``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = """
import json, sys, torch
from dynlogits.kernels import watermark
from dynlogits.processors import watermark_compiled
from dynlogits.sdk.resident.warm import compile_for_vocab
from dynlogits.testing.cuda.specialization import record, variants

vocab, on = int(sys.argv[1]), sys.argv[2] == "on"
cpu = torch.device("cpu")
with record() as probed:
    watermark_compiled._probe(cpu)
with record() as warmed:
    compiled = compile_for_vocab(cpu, vocab, {"watermark": on})
with record() as engine:  # an engine step: 5 rows of 7, logits float32 as vLLM's sampler hands them
    logits = torch.randn(8, vocab)[1:]  # a row view: still 16-byte aligned (the vocab divisible by 4)
    rows, slots = torch.tensor([0, 2, 3, 5, 6]), torch.tensor([1, 0, 4, 2, 3])
    watermark.draw(logits, rows, slots, torch.rand(5, 1) + 0.5, torch.zeros(5, 4, dtype=torch.int64),
                   torch.zeros(5, 4, dtype=torch.int64), torch.tensor([1, 0, 1, 1, 0]), True)
key = lambda found: sorted(repr(k) + repr(sorted(v)) for k, v in variants(found).items())
print(json.dumps({"compiled": compiled, "engine": key(engine), "probed": key(probed), "warmed": key(warmed)}))
"""


def _run(vocab: int, on: bool) -> dict[str, list[str]]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(vocab), "on" if on else "off"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("vocab", [151936, 32000])
def test_the_warm_up_compiles_every_variant_an_engine_step_of_that_vocab_launches(vocab: int) -> None:
    found = _run(vocab, on=True)
    assert found["compiled"] == ["watermark"]
    assert set(found["engine"]) <= set(found["warmed"]) | set(found["probed"])
    assert not set(found["engine"]) <= set(found["probed"])  # the probe alone would leave one to the step


def test_nothing_is_compiled_for_a_gate_that_is_off() -> None:
    found = _run(4096, on=False)
    assert found["compiled"] == [] and found["warmed"] == []


def test_every_gate_s_widen_runs_where_it_is_on_a_plug_in_s_included(caplog: pytest.LogCaptureFixture) -> None:
    """``compile_for_vocab`` names no kind: it runs each registered gate's ``widen`` (a plug-in's as a
    built-in's) where ``ready`` has it on; one that raises is logged and left out."""
    import torch

    from dynlogits.kernels.probe import FusedGate
    from dynlogits.sdk.resident.warm import compile_for_vocab

    seen: list[tuple[str, int]] = []

    def broken(device: torch.device, vocab: int) -> None:
        raise RuntimeError("no such variant")

    gates = [FusedGate("a plug-in kind", lambda device: True, widen=lambda device, vocab: seen.append(("on", vocab))),
             FusedGate("an off plug-in", lambda device: True, widen=lambda device, vocab: seen.append(("off", vocab))),
             FusedGate("a broken plug-in", lambda device: True, widen=broken)]
    ready = {"a plug-in kind": True, "an off plug-in": False, "a broken plug-in": True}
    done = compile_for_vocab(torch.device("cpu"), 4096, ready)
    assert "a plug-in kind" in done and "an off plug-in" not in done and "a broken plug-in" not in done
    assert seen == [("on", 4096)]
    assert "a broken plug-in: the kernels for vocab 4096 not compiled at load" in caplog.text
    del gates
