"""``dynlogits::decided_settle_`` (``dynlogits.kernels.thinking_force``): its eager reference writes
the logits ``force_device_decisions`` and then ``Failures.record_dead`` write, and flags per row the
slots and positions ``record_dead`` flags per slot; its Triton kernel, in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported), equals the reference bit
for bit (float32, bfloat16, float16; NaN logits, masked forced and stop tokens, stop tokens equal to
the forced ones, rows without a stop token, non-members, undecided rows, rows after drafts, which are
stopped but not flagged); it compiles for Hopper and Ampere ahead of time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dynlogits.kernels.fused import declared_launches
from dynlogits.kernels.thinking_force import NO_SEQUENCE, probe_case, sequence_case, settle_reference
from dynlogits.processors.slots import GatheredRows, StepInputs, force_device_decisions
from dynlogits.sdk.resident.failures import Failures

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "drafts"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(8))
def test_the_reference_writes_what_the_forcing_and_record_dead_write(seed: int, dtype: torch.dtype, drafts: bool) -> None:
    """``drafts``: with a real-row mask, as ``record_dead`` given the step's ``real_rows`` (a dead
    row after a draft stopped, not flagged)."""
    logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real = probe_case(seed, dtype=dtype)
    eager = logits.clone()
    step = StepInputs(eager, eager.view(-1), eager.stride(0), positions, stops)
    failures = Failures(sentinel, torch.device("cpu"))
    failures.record_dead(step, [force_device_decisions(step, GatheredRows(slot_of_row, member), decisions)],
                         real if drafts else None)
    if not drafts:
        real = torch.empty(0, dtype=torch.bool)
    settle_reference(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real, NO_SEQUENCE,
                     NO_SEQUENCE, False)
    assert torch.equal(logits.isnan(), eager.isnan()) and torch.equal(logits.nan_to_num(), eager.nan_to_num())
    per_slot = torch.full((sentinel + 1,), -1, dtype=torch.long)  # the per-row flags, as record_dead's per slot
    per_slot.scatter_reduce_(0, flags[0], torch.where(flags[0] < sentinel, flags[1], -1), reduce="amax")
    assert torch.equal(per_slot[:sentinel], failures.flags.dev[:sentinel])
    assert bool(dead.any()) and bool((member & (decisions >= 0) & ~dead).any())  # rows dead and alive


def test_the_cases_hold_stop_tokens_equal_to_the_forced_ones_and_rows_without_one() -> None:
    """The cases are not vacuous: some dead rows force their own stop token, some have none."""
    equal = stopless = 0
    for seed in range(8):
        logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real = probe_case(seed)
        settle_reference(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real,
                         NO_SEQUENCE, NO_SEQUENCE, False)
        equal += int((dead & (stops[slot_of_row] == decisions)).sum())
        stopless += int((dead & (stops[slot_of_row] < 0)).sum())
    assert equal >= 2 and stopless >= 2, (equal, stopless)


@pytest.mark.parametrize("scoped", [False, True], ids=["unscoped", "scoped"])
@pytest.mark.parametrize("seed", range(8))
def test_the_sequence_form_picks_what_settle_at_counts_picked_in_eager_ops(seed: int, scoped: bool) -> None:
    """With a ``sequence``, ``decisions`` are counts: the reference writes what the plain form writes
    given the tokens and positions ``ForcedSequenceGroup.settle_at_counts`` picked in eager ops
    (``clamp``, ``index``, ``minimum``; scoped: ``-1`` where the count is negative), and the cases
    hold negative counts, counts past a sequence and rows forcing its EOS."""
    logits, _, member, slot_of_row, stops, _, sentinel, flags, dead, real = probe_case(seed)
    sequence, length, counts = sequence_case(seed, rows=len(member), slots=sentinel)
    span = length[slot_of_row, 0]
    tokens = sequence[slot_of_row, torch.clamp(counts, torch.zeros((), dtype=torch.long), span)]
    if scoped:
        tokens = torch.where(counts >= 0, tokens, -1)
    want = (logits.clone(), flags.clone(), dead.clone())
    settle_reference(want[0], tokens, member, slot_of_row, stops, counts.minimum(span), sentinel, want[1], want[2],
                     real, NO_SEQUENCE, NO_SEQUENCE, False)
    settle_reference(logits, counts, member, slot_of_row, stops, torch.empty(0, dtype=torch.long), sentinel, flags,
                     dead, real, sequence, length, scoped)
    assert torch.equal(logits.isnan(), want[0].isnan()) and torch.equal(logits.nan_to_num(), want[0].nan_to_num())
    assert torch.equal(flags, want[1]) and torch.equal(dead, want[2])
    assert bool((counts < 0).any()) and bool((counts > span).any()) and bool((member & (tokens >= 0)).any())


def test_the_op_declares_one_launch() -> None:
    assert declared_launches("dynlogits::decided_settle_") == 1


SCRIPT = '''
import os, torch
assert os.environ["TRITON_INTERPRET"] == "1"
from dynlogits.kernels.thinking_force import _probe, same
bad = [(seed, str(dtype)) for seed in range(12) for dtype in (torch.float32, torch.bfloat16, torch.float16)
       if not same(torch.device("cpu"), seed, dtype, positions=seed % 3 != 0, drafts=seed % 2 == 0)
       or not same(torch.device("cpu"), seed, dtype, drafts=seed % 2 == 0, sequence=True, scoped=seed % 3 != 1)]
print("bad", bad)
assert not bad and _probe(torch.device("cpu"))
'''


def test_the_triton_kernel_in_the_interpreter_equals_the_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_the_triton_kernel_compiles_for_cuda_without_a_gpu() -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, each logits
    dtype, with and without positions, in the sequence form scoped or not); not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import thinking_force

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = thinking_force.kernels().settle_rows
    for capability in (90, 80):
        for logits in ("*fp32", "*bf16", "*fp16"):
            for positions, real, sequence, scoped in ((True, False, False, False), (False, True, False, False),
                                                      (False, False, True, True), (False, True, True, False)):
                signature = {"logits_ptr": logits, "logits_s0": "i64", "decisions_ptr": "*i64", "member_ptr": "*i1",
                             "slots_ptr": "*i64", "stops_ptr": "*i64", "positions_ptr": "*i32" if positions else "*i64",
                             "flags_ptr": "*i64", "flags_s0": "i64", "dead_ptr": "*i1", "real_ptr": "*i1", "vocab": "i32",
                             "sentinel": "i32", "seq_ptr": "*i64", "seq_s0": "i64", "len_ptr": "*i64", "len_s0": "i64",
                             "HAS_POSITIONS": "constexpr", "HAS_REAL": "constexpr", "HAS_SEQUENCE": "constexpr",
                             "SCOPED": "constexpr", "BLOCK": "constexpr"}
                source = ASTSource(fn=kernel, signature=signature,
                                   constexprs={"HAS_POSITIONS": positions, "HAS_REAL": real, "HAS_SEQUENCE": sequence,
                                               "SCOPED": scoped, "BLOCK": thinking_force.BLOCK})
                compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                assert "settle_rows" in compiled.asm["ptx"]
