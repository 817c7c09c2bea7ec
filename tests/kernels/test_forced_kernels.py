"""``forced_sequence``'s fused settle (``processors.forced_settle.settle_``, and ``pick_settle_``
with Model Runner V2's pick): its Triton kernels in
Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported)
against its eager reference bit for bit, compiled ahead of time for Hopper and Ampere, the eager
reference against the group's eager path, and a steady forced step's launches in the CUDA model on
both runners."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dynlogits.processors import forced_settle as F
from dynlogits.testing.cuda.drive import adapter_counts
from dynlogits.tools.bench import workloads

CPU = torch.device("cpu")

SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import forced as K
    from dynlogits.processors import forced_settle as F

    checked = dead = 0
    for seed in range(40):
        for planes in (2, 3):
            for stops in (False, True):
                for dtype in (torch.float32, torch.bfloat16):
                    vocab = 300 if seed % 3 else 2500  # rows wider than a fill program's block
                    logits, rows, picked, if_dead, can_stop = F.probe_case(
                        seed, torch.device("cpu"), rows=1 + seed % 20, vocab=vocab, planes=planes, stops=stops)
                    logits = logits.to(dtype)
                    outs = []
                    for impl in (K.settle_, F.settle_.eager):
                        out = (logits.clone(), torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
                        impl(out[0], rows, picked, if_dead, can_stop, out[1], out[2])
                        outs.append(out)
                    for got, want in zip(*outs):
                        assert torch.equal(got, want), (seed, planes, stops, dtype)
                    dead += int(outs[1][2].sum())
                    checked += 1
    assert dead > 200, dead
    for seed in range(20):  # the pick too (Model Runner V2)
        for identity in (False, True):
            for stops in (False, True):
                for dtype in (torch.int32, torch.int64):
                    rows = 1 + seed % 20
                    logits, r, table, bounds, values, ident, can_stop = F.pick_probe_case(
                        seed, torch.device("cpu"), rows=rows, width=5 + 13 * (seed % 5), identity=identity,
                        stops=stops, dtype=dtype)
                    outs = []
                    for impl in (K.pick_settle_, F.pick_settle_.eager):
                        out = (logits.clone(), torch.empty((6, rows), dtype=torch.long),
                               torch.empty((3, rows), dtype=torch.long), torch.empty(rows, dtype=torch.bool))
                        impl(out[0], r, table, bounds, values, ident, can_stop, *out[1:])
                        outs.append(out)
                    for got, want in zip(*outs):
                        assert torch.equal(got, want), (seed, identity, stops, dtype, "pick")
                    dead += int(outs[1][3].sum())
                    checked += 1
    assert F._probe(torch.device("cpu")), "the gate's probe (kernels against the eager reference)"
    print("checked", checked)
''')


def test_the_triton_kernels_in_the_interpreter_equal_the_eager_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 480" in done.stdout


@pytest.mark.parametrize("logits_type", ["*fp32", "*bf16", "*fp16"])
def test_the_triton_kernels_compile_for_cuda_without_a_gpu(logits_type: str) -> None:
    """Triton's NVIDIA backend compiles both kernels ahead of time (Hopper and Ampere, two or three
    planes, with and without stop tokens): what the interpreter does not check; not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import forced

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    k = forced.kernels()
    decide = {"flat_ptr": logits_type, "picked_ptr": "*i64", "picked_s0": "i64", "picked_s1": "i64",
              "if_dead_ptr": "*i64", "if_dead_s0": "i64", "if_dead_s1": "i64", "stops_ptr": "*i1",
              "chosen_ptr": "*i64", "chosen_s0": "i64", "chosen_s1": "i64", "dead_ptr": "*i1", "n": "i32",
              "PLANES": "constexpr", "HAS_STOPS": "constexpr", "BLOCK": "constexpr"}
    fill = {"logits_ptr": logits_type, "stride": "i64", "rows_ptr": "*i64", "chosen_ptr": "*i64", "chosen_s1": "i64",
            "dead_ptr": "*i1", "stops_ptr": "*i1", "vocab": "i32", "HAS_STOPS": "constexpr", "BLOCK": "constexpr"}
    pick = {"flat_ptr": logits_type, "rows_ptr": "*i64", "values_ptr": "*i64", "bounds_ptr": "*i64", "bounds_s0": "i64",
            "bounds_s1": "i64", "width": "i32", "table_ptr": "*i64", "table_s0": "i64", "table_s1": "i64",
            "table_s2": "i64", "stops_ptr": "*i1", "pick_ptr": "*i64", "pick_s0": "i64", "pick_s1": "i64",
            "chosen_ptr": "*i64", "chosen_s0": "i64", "chosen_s1": "i64", "dead_ptr": "*i1", "n": "i32",
            "IDENTITY": "constexpr", "HAS_STOPS": "constexpr", "BLOCK": "constexpr", "WBLOCK": "constexpr"}
    for capability in (90, 80):
        for stops in (False, True):
            for planes in (2, 3):
                source = ASTSource(fn=k.decide_rows, signature=decide, constexprs={
                    "PLANES": planes, "HAS_STOPS": stops, "BLOCK": forced.DECIDE_BLOCK})
                assert "decide_rows" in triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"]
            for identity in (False, True):
                for values in ("*i32", "*i64"):
                    source = ASTSource(fn=k.pick_decide_rows, signature=dict(pick, values_ptr=values, bounds_ptr=values),
                                       constexprs={"IDENTITY": identity, "HAS_STOPS": stops,
                                                   "BLOCK": forced.DECIDE_BLOCK, "WBLOCK": forced.WIDTH_BLOCK})
                    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                    assert "pick_decide_rows" in compiled.asm["ptx"]
            source = ASTSource(fn=k.fill_rows, signature=fill,
                               constexprs={"HAS_STOPS": stops, "BLOCK": forced.FILL_BLOCK})
            assert "fill_rows" in triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"]


def _eager_settle(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
                  can_stop: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ForcedSequenceGroup._settle``'s eager ops, as written there before the fused op."""
    flat = logits.view(-1)
    kept = flat.index_select(0, picked[0])
    dead = torch.isneginf(kept)
    chosen = torch.empty_like(picked)
    if can_stop is None:
        torch.where(dead, if_dead, picked, out=chosen)
        value = None
    else:
        stops = torch.stack([can_stop] + [torch.ones_like(can_stop)] * (picked.shape[0] - 1))
        torch.where(dead & stops, if_dead, picked, out=chosen)
        value = torch.where(dead, torch.where(can_stop, 0.0, float("-inf")).to(logits.dtype),
                            torch.zeros((), dtype=logits.dtype))
    logits.index_fill_(0, rows, float("-inf"))
    if value is None:
        flat.index_fill_(0, chosen[0], 0.0)
    else:
        flat.index_copy_(0, chosen[0], value)
    return logits, chosen, dead


def test_the_eager_reference_writes_what_the_groups_eager_settle_writes() -> None:
    dead = 0
    for seed in range(200):
        logits, rows, picked, if_dead, can_stop = F.probe_case(seed, CPU, rows=1 + seed % 13, planes=2 + seed % 2,
                                                               stops=seed % 3 > 0)
        want = _eager_settle(logits.clone(), rows, picked, if_dead, can_stop)
        got = (logits.clone(), torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
        F.settle_(*got[:1], rows, picked, if_dead, can_stop, got[1], got[2])
        for a, b in zip(got, want):
            assert torch.equal(a, b), seed
        dead += int(want[2].sum())
    assert dead > 150


@pytest.mark.parametrize(("impl", "want"), [("adapter", 4), ("adapter_v2", 3)])
def test_a_steady_forced_step_takes_at_most_four_launches_on_both_runners(impl: str, want: int) -> None:
    """V1: the upload, the fused settle (two kernels), the flags' copy back; Model Runner V2: the
    fused pick and settle (two kernels), the flags' copy back. 0 syncs over batch changes and a
    failing request."""
    vocab = 32000
    payloads = [workloads.payload("forced_sequence", vocab_size=vocab, eos_token_id=2, seed=i) for i in range(8)]
    launches, syncs = adapter_counts(impl, vocab, payloads)
    assert (launches, syncs) == (want, 0)


def test_the_gpu_checks_cpu_self_test_finds_the_kernels_equal_to_the_eager_reference() -> None:
    """``python -m dynlogits.testing.cuda.forced_check --cpu``: the GPU check's ``bits`` with the
    kernels in Triton's interpreter (the code a GPU session runs, short of the device)."""
    pytest.importorskip("triton")
    from dynlogits.testing.cuda import forced_check

    assert forced_check.cpu_check(vocab=1501, batches=(1, 9))
