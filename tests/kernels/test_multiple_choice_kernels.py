"""``multiple_choice``' fused op (``dynlogits::multiple_choice_keep_``, ``dynlogits.kernels.multiple_choice``):
its reference (``keep_reference``, the CPU implementation) against a plain per-row reading of the
contract on random steps (NaN and infinite logits, duplicate ids, ``at_least`` entries, rows out of
phase, non-members, rows matching none, ``-1`` placeholders, bases past the matrix, drafts before a
row: 0 to 3, placeholders among them), and against a real ``MultipleChoiceGroup``'s eager device
path (its counting decision with int32 tokens, cell by cell with int64 or drafts, scoped
``apply_floored``) and the hosted processor; its Triton kernel in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported) against the reference bit
for bit, and the gate's probe passing there; the kernel compiled ahead of time for sm_90 and sm_80;
one declared launch (counted so in the CUDA model, no sync) and the gate's fallback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from fused_gates import a_failed_probe_falls_back

from dynlogits.kernels import multiple_choice as K
from dynlogits.testing.cuda import multiple_choice_check as C

CPU = torch.device("cpu")


def _contract(case: K.Case) -> torch.Tensor:
    """The module doc's rule read row by row and entry by entry in Python: the logits it makes."""
    out = case.logits.clone()
    engines, length = case.tokens.shape
    width = case.width
    drafts = case.input_ids is not None and case.local_pos is not None

    def token(r: int, engine: int, base: int, pos: int, j: int) -> int:
        q = min(base + j, pos) if drafts else base + j
        if drafts and pos - q <= int(case.local_pos[r]):  # type: ignore[index]
            return int(case.input_ids[max(r - (pos - q), 0)])  # type: ignore[index]
        return int(case.tokens[engine, min(max(q, 0), length - 1)])

    for r in range(len(case.pos)):
        base = int(case.base[r])
        if not bool(case.member[r]) or base >= K.OUT_OF_PHASE:
            continue
        slot = int(case.slot_of_row[r])
        engine = min(slot, engines - 1)
        pos = int(case.pos[r])
        n = max(pos - base + 1, 0)
        keep = set()
        for e in range(case.entries):
            cells = case.prefix[slot, e * width:(e + 1) * width].tolist()
            same = all(c < 0 or c == token(r, engine, base, pos, j) for j, c in enumerate(cells))
            depth = int(case.depth[slot, e])
            if same and (depth == n or (bool(case.at_least[slot, e]) and depth <= n)):
                keep.add(int(case.ids[slot, e]))
        out[r] = float("-inf")
        at = torch.tensor(sorted(keep), dtype=torch.long)
        out[r, at] = case.logits[r, at]
    return out


@pytest.mark.parametrize("drafts", [0, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_reference_keeps_what_the_contract_says_bit_for_bit(dtype: torch.dtype, drafts: int) -> None:
    kept = untouched = none = 0
    for seed in range(40):
        case = K.probe_case(seed, rows=1 + seed % 13, width=(1, 3, 5, 9)[seed % 4], entries=1 + seed % 23, dtype=dtype,
                            tokens_dtype=(torch.int32, torch.int64)[seed % 2], drafts=drafts)
        got = case.logits.clone()
        K.keep_reference(got, *case[1:])
        assert K.same_bits(got, _contract(case)), seed
        acting = case.member & (case.base < K.OUT_OF_PHASE)
        kept += int((~got.isneginf() & acting[:, None]).sum())
        untouched += int((~acting).sum())
        none += int((got.isneginf().all(1) & acting).sum())
    assert kept > 100 and untouched > 40 and none > 10  # the cases keep, leave rows alone, and keep nothing


@pytest.mark.parametrize("drafts", [0, 2], ids=["plain", "drafts"])
@pytest.mark.parametrize("tokens_dtype", [torch.int32, torch.int64], ids=["count", "cells"])
def test_the_reference_at_the_prompt_length_equals_the_groups_eager_path_and_the_hosted_processor(
        tokens_dtype: torch.dtype, drafts: int) -> None:
    """``base`` the prompt's length: the group's eager device path (without drafts, int32 tokens:
    its counting decision, ``_decide_by_count``; else cell by cell, drafts read by
    ``TokenWindow.head``) bit for bit; with stretch starts after the prompt and rows out of phase,
    the group's ``apply_floored`` bit for bit; each row what its processor allows after its
    history (its stretch), the drafts before it included."""
    kept = drafted = 0
    for seed in range(50):
        for scoped in (False, True):
            case = C.group_case(seed, requests=1 + seed % 9, tokens_dtype=tokens_dtype, longest=(2, 4, 7)[seed % 3],
                                scoped=scoped, drafts=drafts)
            got = case.logits.clone()
            K.keep_reference(*C.fused_args(case, got))
            by_group = case.logits.clone()
            C.eager_group(case, by_group)
            assert K.same_bits(got, by_group), (seed, scoped)
            assert C.hosted_rows(case, got, case.logits) == 0, (seed, scoped)
            kept += int((~got.isneginf() & case.rows.member[:, None]).sum())
            if drafts:
                assert case.window.local_pos is not None
                drafted += int((case.window.local_pos > 0).sum())
    assert kept > 1000
    assert drafted > 100 or not drafts


def test_the_op_on_the_cpu_is_the_reference_and_declares_one_launch() -> None:
    from dynlogits.kernels.fused import registered

    assert registered()["dynlogits::multiple_choice_keep_"].launches == 1  # keep_rows
    for seed in range(8):
        case = K.probe_case(seed, entries=9, dtype=torch.bfloat16, drafts=2 * (seed % 2))
        by_op, by_reference = case.logits.clone(), case.logits.clone()
        K.multiple_choice_keep_(by_op, *case[1:])
        K.keep_reference(by_reference, *case[1:])
        assert K.same_bits(by_op, by_reference), seed


@pytest.mark.parametrize("drafts", [0, 2])
def test_the_op_in_the_cuda_model_is_one_launch_no_sync_and_the_references_result(drafts: int) -> None:
    """``SimCuda`` (what the engine-driving tests run): the op counts its one declared launch, reads
    nothing back, and writes what ``keep_reference`` writes on the CPU; with drafts too."""
    from dynlogits.testing.cuda.simcuda import SimCuda

    case = K.probe_case(11, entries=20, dtype=torch.bfloat16, tokens_dtype=torch.int64, drafts=drafts)
    want = case.logits.clone()
    K.keep_reference(want, *case[1:])
    with SimCuda() as sim:
        with sim.paused():
            moved: dict[str, Any] = {k: sim.put(v) for k, v in case._asdict().items() if isinstance(v, torch.Tensor)}
            on = case._replace(**moved)
        before = sim.launches
        K.multiple_choice_keep_(*on)
        ops, launches, syncs = list(sim.ops), sim.launches - before, list(sim.syncs)
    assert ops[-1:] == ["multiple_choice_keep_"] and launches == 1 and not syncs, ops
    assert K.same_bits(sim.value(on.logits), want)


SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import multiple_choice as K
    from dynlogits.testing.cuda import multiple_choice_check as C

    checked = kept = 0
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    for seed in range(24):
        for width in (1, 2, 5, 8, 9, 33, 40):
            case = K.probe_case(seed, rows=1 + seed % 13, width=width, entries=(1, 7, 70, 130)[seed % 4],
                                dtype=dtypes[seed % 3], tokens_dtype=(torch.int32, torch.int64)[seed % 2],
                                drafts=(0, 2, 0, 3, 1)[(seed + width) % 5])
            fused, host = case.logits.clone(), case.logits.clone()
            wide = torch.cat([case.logits, case.logits[:, :7]], dim=1)
            if seed % 4 == 1:  # rows of wider logits (the row stride past V): the columns past V untouched
                fused = wide[:, :case.logits.shape[1]]
                assert fused.stride(0) > fused.shape[1]
            chunk = (16, 37, 64, K.CHUNK)[seed % 4]  # rows of 4, 2, 1 and 1 chunks
            K.launch(fused, *case[1:], chunk=chunk)
            K.keep_reference(host, *case[1:])
            assert K.same_bits(fused, host), (seed, width, chunk)
            assert K.same_bits(wide[:, case.logits.shape[1]:], case.logits[:, :7]), (seed, width, chunk)
            kept += int((~host.isneginf() & case.member[:, None]).sum())
            checked += 1
    for entries, width, vocab, chunk in ((0, 3, 40, 16), (2000, 2, 3000, 1024), (300, 13, 5000, K.CHUNK)):
        case = K.probe_case(7, rows=5, entries=entries, width=width, vocab=vocab)  # none; thousands; fills in blocks
        fused, host = case.logits.clone(), case.logits.clone()
        K.launch(fused, *case[1:], chunk=chunk)
        K.keep_reference(host, *case[1:])
        assert K.same_bits(fused, host), (entries, width)
        checked += 1
    for seed in range(12):  # a real group's tables, against its eager path and the hosted processor
        for tokens_dtype in (torch.int32, torch.int64):
            for drafts in (0, 2):
                case = C.group_case(seed, requests=1 + seed % 9, tokens_dtype=tokens_dtype, longest=(3, 12)[seed % 2],
                                    scoped=seed % 3 == 2, drafts=drafts)
                fused = case.logits.clone()
                K.launch(*C.fused_args(case, fused), chunk=(16, K.CHUNK)[seed % 2])
                assert C.hosted_rows(case, fused, case.logits) == 0, (seed, drafts, "hosted")
                by_group = case.logits.clone()
                C.eager_group(case, by_group)
                assert K.same_bits(fused, by_group), (seed, drafts, "group")
                checked += 1
    assert kept > 1000, kept
    assert K.probe(torch.device("cpu")), "the gate's probe (kernel against keep_reference)"
    print("checked", checked)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 219" in done.stdout


def test_the_gpu_checks_self_test_passes_in_the_interpreter() -> None:
    """``multiple_choice_check``'s ``bits`` on the CPU (kernel in the interpreter against the
    reference, the group's eager path and the hosted processor)."""
    pytest.importorskip("triton")
    assert C.cpu_check(vocab=301, batches=(1, 6))


def _without_barriers(tmp_path: Path) -> object:
    """The kernel's module with its two ``tl.debug_barrier()`` calls removed (a file: Triton reads
    a kernel's source), imported."""
    source = Path(K.kernels().__file__).read_text()
    assert source.count("tl.debug_barrier()") == 2
    path = tmp_path / "_multiple_choice_no_barriers.py"
    path.write_text(source.replace("tl.debug_barrier()", "pass"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("logits_type", ["*fp32", "*bf16"])
def test_the_triton_kernel_compiles_for_cuda_without_a_gpu(logits_type: str, tmp_path: Path) -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, both column
    blocks, int32 tokens with drafts and int64 without, the launch's warps and chunk): what the
    interpreter does not check (types, the lowering); not run. Both barriers survive: the PTX holds two ``bar.sync`` more
    than the same kernel without them (the reductions have their own)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    bare = _without_barriers(tmp_path).keep_rows  # type: ignore[attr-defined]
    for capability in (90, 80):
        for width in (5, 40):
            for tokens_type in ("*i32", "*i64"):
                signature = {"logits_ptr": logits_type, "logits_s0": "i64", "tokens_ptr": tokens_type, "tokens_s0": "i64",
                             "tokens_s1": "i64", "maxlen": "i32", "engine_slots": "i32", "base_ptr": "*i64",
                             "pos_ptr": "*i64", "slot_ptr": "*i64", "member_ptr": "*u8", "prefix_ptr": "*i32",
                             "prefix_s0": "i64", "depth_ptr": "*i64", "depth_s0": "i64", "at_least_ptr": "*u8",
                             "at_least_s0": "i64", "ids_ptr": "*i64", "ids_s0": "i64", "input_ptr": tokens_type,
                             "local_ptr": "*i64", "saved_ptr": logits_type, "at_ptr": "*i32", "entries": "i32",
                             "width": "i32", "vocab": "i32", "BLOCK_E": "constexpr", "BLOCK_W": "constexpr",
                             "BLOCK_V": "constexpr", "CHUNK": "constexpr", "HAS_DRAFTS": "constexpr"}
                constexprs = {"BLOCK_E": K.BLOCK_E, "BLOCK_W": K.block_width(width), "BLOCK_V": K.BLOCK_V,
                              "CHUNK": K.CHUNK, "HAS_DRAFTS": tokens_type == "*i32"}
                ptx = {}
                for name, kernel in (("kept", K.kernels().keep_rows), ("bare", bare)):
                    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
                    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                                              options={"num_warps": K.NUM_WARPS})
                    ptx[name] = compiled.asm["ptx"]
                assert "keep_rows" in ptx["kept"]
                assert ptx["kept"].count("bar.sync") == ptx["bare"].count("bar.sync") + 2, (capability, width)


def test_a_failed_probe_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    a_failed_probe_falls_back(monkeypatch, caplog, K, "probe", "multiple_choice")
