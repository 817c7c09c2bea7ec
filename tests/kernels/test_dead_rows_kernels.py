"""``dynlogits::dead_rows_`` (``dynlogits.kernels.dead_rows``, the restrictive groups' dead-row
epilogue of ``Failures.record_dead``): its eager reference does, row by row, what the contract says
(both layouts; with and without positions, stop flags, rows touched, drafts); its Triton kernel, in
Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported),
equals the reference bit for bit; it compiles for Hopper and Ampere ahead of time; the GPU check's
CPU self test passes."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from dynlogits.kernels import dead_rows as D
from dynlogits.kernels.fused import declared_launches

CPU = torch.device("cpu")
#: (listed, positions, stops, real): every combination of the optional arguments
VARIANTS = [(listed, positions, stops, real) for listed in (True, False) for positions in (True, False)
            for stops in (True, False) for real in (True, False)]


def _row_by_row(case: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract of ``dead_rows_`` one row at a time, in Python: the logits and flags it leaves."""
    logits, witness, rows, slots, positions, stop_index, can_stop, stops, where, real_rows, flags = case
    logits, flags = logits.clone(), flags.clone()
    flat = logits.view(-1)
    for i in range(witness.shape[0]):
        row = int(rows[i]) if rows is not None else i
        values = [float(flat[int(k)]) if rows is not None else float(logits[i, int(k)]) for k in witness[i]]
        dead = all(v == float("-inf") for v in values) and (where is None or bool(where[i]))
        slot = int(slots[i])
        if dead and rows is not None and (can_stop is None or bool(can_stop[i])):
            flat[int(stop_index[i])] = 0.0
        if dead and rows is None and int(stops[slot]) >= 0:
            logits[i, int(stops[slot])] = 0.0
        flagged = dead and (real_rows is None or bool(real_rows[row]))
        value = (int(positions[i]) if positions is not None else 0) if flagged else -1
        flags[slot] = max(int(flags[slot]), value)
    return logits, flags


@pytest.mark.parametrize(("listed", "positions", "stops", "real"), VARIANTS)
def test_the_reference_settles_and_flags_each_dead_row_as_the_contract_says(listed: bool, positions: bool,
                                                                            stops: bool, real: bool) -> None:
    dead = stopped = 0
    for seed in range(6):
        case = D.probe_case(seed, CPU, listed=listed, rows=3 + seed, width=1 + seed % 4, positions=positions,
                            stops=stops, real=real)
        want = _row_by_row(case)
        logits, flags = D.apply(D.dead_rows_, case)
        assert torch.equal(logits.isnan(), want[0].isnan()) and torch.equal(logits.nan_to_num(), want[0].nan_to_num())
        assert torch.equal(flags, want[1]), seed
        dead += int(D.evaluate_reference(case[0], case[1], listed, case[8]).sum())
        stopped += int((logits.nan_to_num() != case[0].nan_to_num()).sum())
    assert dead > 0 and stopped > 0  # not vacuous: dead rows, and stop tokens written


def test_the_op_declares_one_launch() -> None:
    assert declared_launches("dynlogits::dead_rows_") == 1


SCRIPT = '''
import os, torch
assert os.environ["TRITON_INTERPRET"] == "1"
from dynlogits.kernels import dead_rows as D
cpu = torch.device("cpu")
checked, bad = 0, []
for seed in range(10):
    for listed in (True, False):
        for positions in (True, False):
            for stops in (True, False):
                for real in (True, False):
                    dtype = (torch.float32, torch.bfloat16, torch.float16)[seed % 3]
                    width = (1, 7, D.BLOCK + 3)[seed % 3]  # wider than a program's block too
                    case = D.probe_case(seed, cpu, listed=listed, rows=1 + 3 * seed, width=width, positions=positions,
                                        stops=stops, real=real, dtype=dtype)
                    if not D.same(cpu, case):
                        bad.append((seed, listed, positions, stops, real))
                    checked += 1
print("checked", checked, "bad", bad)
assert not bad and D._probe(cpu)
'''


def test_the_triton_kernel_in_the_interpreter_equals_the_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "checked 160" in done.stdout


def test_the_triton_kernel_compiles_for_cuda_without_a_gpu() -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, each logits
    dtype, both layouts, with and without every optional argument); not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = D.kernels().dead_rows
    for capability in (90, 80):
        for logits in ("*fp32", "*bf16", "*fp16"):
            for listed, positions, stops, real in VARIANTS:
                signature = {"logits_ptr": logits, "logits_s0": "i64", "witness_ptr": "*i64", "witness_s0": "i64",
                             "witness_s1": "i64", "width": "i32", "rows_ptr": "*i64", "slots_ptr": "*i64",
                             "positions_ptr": "*i64", "stop_ptr": "*i64",
                             "can_stop_ptr": "*i1" if listed and stops else "*i64",
                             "where_ptr": "*i1" if stops and not listed else "*i64",
                             "real_ptr": "*i1" if real else "*i64", "flags_ptr": "*i64",
                             "LISTED": "constexpr", "HAS_POSITIONS": "constexpr", "HAS_CAN_STOP": "constexpr",
                             "HAS_WHERE": "constexpr", "HAS_REAL": "constexpr", "BLOCK": "constexpr"}
                constexprs = {"LISTED": listed, "HAS_POSITIONS": positions, "HAS_CAN_STOP": listed and stops,
                              "HAS_WHERE": stops and not listed, "HAS_REAL": real, "BLOCK": D.BLOCK}
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                          target=GPUTarget("cuda", capability, 32))
                assert "dead_rows" in compiled.asm["ptx"] and "atom" in compiled.asm["ptx"]


def test_the_gpu_checks_cpu_self_test_finds_the_kernel_equal_to_the_eager_reference() -> None:
    """``python -m dynlogits.testing.cuda.dead_rows_check --cpu``: the GPU check's ``bits`` with
    the kernel in Triton's interpreter (the code a GPU session runs, short of the device)."""
    pytest.importorskip("triton")
    from dynlogits.testing.cuda import dead_rows_check

    assert dead_rows_check.cpu_check(vocab=1501, batches=(1, 9, 24))



def _record(case: tuple[Any, ...], put: Any, device: torch.device) -> tuple[Any, torch.Tensor, Any]:
    """``Failures.record_dead`` over a ``probe_case``'s ``Dead`` (``put``: each tensor onto the
    device) and one its group settled (rows of slots above 2 empty); the logits, the flags."""
    from dynlogits.processors.slots import Dead, StepInputs
    from dynlogits.sdk.resident.failures import Failures

    moved: list[Any] = [None if t is None else put(t) for t in case]
    logits, witness, rows, slots, positions, stop_index, can_stop, stops, where, real_rows, _ = moved
    failures = Failures(5, device)
    step = StepInputs(logits, logits.view(-1), logits.stride(0), None, stops if stops is not None else slots)
    dead = Dead(rows, slots, witness, positions, stop_index, can_stop, where)
    settled = Dead(rows, slots, None, positions, settled=put(case[3] > 2))
    failures.record_dead(step, [dead, settled], real_rows)
    return logits, failures.flags.dev, failures


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "gathered"])
def test_record_dead_queues_one_fused_op_per_dead_and_writes_what_the_cpu_writes(listed: bool) -> None:
    """``Failures.record_dead`` in the CUDA model: one ``dead_rows_`` for a group's ``Dead`` (the
    eager ops on the CPU), the same logits and flags; a ``Dead`` its group settled keeps its flag
    ops (``where``, ``scatter_reduce_``, after the drafts' mask)."""
    from dynlogits.testing.cuda.simcuda import SimCuda

    case = D.probe_case(7, CPU, listed=listed, rows=9, width=3, slots=5, real=True)
    want_logits, want_flags, _ = _record(case, lambda t: t.clone(), CPU)
    with SimCuda() as sim:
        with sim.paused():
            setup = [sim.put(t) if isinstance(t, torch.Tensor) else t for t in case]
        got_logits, got_flags, _ = _record(tuple(setup), lambda t: t, sim.device)
        ops, syncs = list(sim.ops), list(sim.syncs)
    own = ["index", "bitwise_and"] if listed else ["bitwise_and"]  # the settled rows' drafts mask
    assert ops[-len(own) - 3:] == ["dead_rows_", *own, "where", "scatter_reduce_"] and not syncs, ops
    assert torch.equal(sim.value(got_logits).nan_to_num(), want_logits.nan_to_num())
    assert torch.equal(sim.value(got_flags), want_flags) and bool((want_flags >= 0).any())
