"""The fused kernels' GPU check modules (``forced_check``, ``dead_rows_check``,
``no_repeat_ngram_check``, ``multiple_choice_check`` through ``kernel_check``) run their whole GPU
sequence on the CPU, with the kernels in Triton's interpreter (a subprocess: ``TRITON_INTERPRET=1``
before Triton is imported) and the CUDA-only measurements (profiler op counts, the sync debug mode,
CUDA events) stubbed: every record and line they make, and a failing op count failing the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.testing.cuda import dead_rows_check, forced_check, kernel_check, multiple_choice_check, no_repeat_ngram_check

    ops = int(sys.argv[1])
    kernel_check.device_ops = lambda fn, steps, trace_dir=None: (fn(), (ops, ["k"]))[1]
    kernel_check.sync_error = lambda *calls: [c() for c in calls] and ""
    kernel_check.timed = lambda fn, steps, warmup=3: (fn(), (0.5, 0.25))[1]
    for module, cases in ((forced_check, 2), (dead_rows_check, 2), (no_repeat_ngram_check, 2), (multiple_choice_check, 2)):
        ok, results = module.run(torch.device("cpu"), vocab=301, steps=2, batches=(1, 5))
        assert len(results["kernels"]) == len(results["sync"]) == len(results["time"]) == 2 * cases, module
        assert all(r["error"] == "" for r in results["sync"]), module
        assert all(r["fused_device_ms"] == 0.25 for r in results["time"]), module
        print(module.__name__.rsplit(".", 1)[-1], ok)
''')


@pytest.mark.parametrize(("ops", "passes"), [(1, True), (3, False)])
def test_each_gpu_check_runs_its_sequence_and_judges_the_op_count(ops: int, passes: bool) -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ops)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = dict(line.split() for line in done.stdout.splitlines() if line.endswith(("True", "False")))
    assert verdicts == {name: str(passes) for name in ("forced_check", "dead_rows_check", "no_repeat_ngram_check",
                                                       "multiple_choice_check")}
