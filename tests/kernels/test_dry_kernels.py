"""The ``dry`` kind's Triton kernel (``dynlogits.kernels.dry.decide``) in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported) against the eager reference
(``dry_device.device_penalties`` and ``lower_rows``'s values before their ``scatter_reduce_``): every
position's id and lowered logit bit for bit, float32, bfloat16, float16 and float64 logits, drafts or
not, breakers, placeholders, look-backs, prompts counted or not, caps, per-row floors (a scoped
entry's stretch; ``NEVER``) or none, a long periodic window whose repeats run to the cap, a wide
breaker table; then the CUDA implementation's whole step and the
kind's probe on CPU tensors. And Triton's NVIDIA backend compiles the kernel ahead of time (what the
interpreter does not check: types, the lowering of the early-exit loop); not run on a GPU here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import dry as K
    from dynlogits.processors import dry_device as D
    from dynlogits.processors.window import TokenWindow

    def eager(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, singles, amounts,
              width, cap, floor):
        window = TokenWindow("cpu").at(tokens, prompt_len, pos, input_ids, local_pos)
        ids, penalty = D.device_penalties(window, slot_of_row, member, params[slot_of_row], singles[slot_of_row],
                                          amounts[slot_of_row], width, cap, D.constants(width, cap, torch.device("cpu")),
                                          floor)
        info = torch.finfo(logits.dtype)
        kept = logits.gather(1, ids)
        lowered = kept - penalty.clamp_max(info.max).to(logits.dtype)
        torch.maximum(lowered, kept.clamp_max(info.min), out=lowered)
        return ids, lowered

    def periodic(seed):
        """A long window: a 7-token cycle repeated past the cap, a breaker in one slot, 3 rows."""
        made, _, _ = D.probe_case(seed, rows=3, slots=3, max_len=320, drafts=False)
        args = list(made)
        g = torch.Generator().manual_seed(seed)
        cycle = torch.randint(0, 30, (7,), generator=g, dtype=torch.int32)
        args[0] = torch.randn(3, 40, generator=g) * 3
        args[1][:] = cycle.repeat(46)[:320]
        args[1][2, 150] = 1  # a breaker of slot 1's table in slot 2's history
        args[3][:] = torch.tensor([319, 300, 250], dtype=torch.int32)
        args[6][:] = torch.tensor([0, 1, 2])
        args[7][:] = True
        args[8][:, 1] = 400  # look back over everything
        args[8][:, 3] = 160
        wide = torch.sort(torch.randint(0, 30, (3 + 1, 40), generator=g))[0]
        args[9] = wide  # 40 breakers a slot (some repeated)
        args[9][0] = D.NO_BREAKER
        args[10] = torch.rand(3 + 1, 161, generator=g, dtype=torch.float64).cumsum(1)
        return args, 300, 160

    def floored(case, seed):
        args, width, cap = case
        return args, width, cap, D.probe_floor(seed, args)

    cases = [(*D.probe_case(seed, drafts=drafts), None) for seed in range(5) for drafts in (True, False)]
    cases += [floored(D.probe_case(seed, drafts=drafts), seed) for seed in range(20, 24) for drafts in (True, False)]
    cases += [(*periodic(seed), None) for seed in (7, 8)]
    cases.append(floored(periodic(6), 6))
    cases.append((*D.probe_case(9, rows=1, drafts=False), None))
    checked = lowered_any = 0
    for args, width, cap, floor in cases:
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            a = [args[0].to(dtype), *args[1:]]
            ids, lowered = K.decide(*a, width, cap, floor)
            want_ids, want = eager(*a, width, cap, floor)
            assert torch.equal(ids, want_ids), ("ids", dtype)
            assert torch.equal(lowered.isnan(), want.isnan()), ("nan", dtype)
            assert torch.equal(lowered.nan_to_num().view(torch.uint8), want.nan_to_num().view(torch.uint8)), ("bits", dtype)
            lowered_any += int((lowered.nan_to_num() != a[0].gather(1, ids).nan_to_num()).sum())
            # the CUDA implementation's whole step against the reference step
            fused, dense = a[0].clone(), a[0].clone()
            D._fused_lower_cuda(fused, *a[1:], width, cap, floor)
            D.dense_lower_(dense, *a[1:], width, cap, floor)
            assert torch.equal(fused.isnan(), dense.isnan()), ("step nan", dtype)
            assert torch.equal(fused.nan_to_num(), dense.nan_to_num()), ("step", dtype)
            checked += 1
    assert lowered_any > 200, lowered_any  # the premise: positions were penalized
    assert D._probe(torch.device("cpu"))
    print("checked", checked)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_eager_reference_bit_for_bit() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 88" in done.stdout


@pytest.mark.parametrize("logits_type", ["*fp32", "*bf16", "*fp16", "*fp64"])
def test_the_triton_kernel_compiles_for_cuda_without_a_gpu(logits_type: str) -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, drafts or not,
    floors or not, int32 windows as vLLM's, int64 ones): not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import dry

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = dry.kernels().decide_rows
    for tokens_type in ("*i32", "*i64"):
        signature = {"logits_ptr": logits_type, "logits_stride": "i64", "tokens_ptr": tokens_type,
                     "tokens_stride": "i64", "n_token_rows": "i32", "prompt_ptr": tokens_type, "prompt_stride": "i64",
                     "pos_ptr": tokens_type, "pos_stride": "i64", "input_ptr": tokens_type, "input_stride": "i64",
                     "local_ptr": tokens_type, "local_stride": "i64", "slot_ptr": "*i64", "slot_stride": "i64",
                     "member_ptr": "*u8", "member_stride": "i64", "floor_ptr": "*i64", "floor_stride": "i64",
                     "params_ptr": "*i64", "params_stride": "i64",
                     "singles_ptr": "*i64", "singles_stride": "i64", "n_singles": "i32", "amounts_ptr": "*fp64",
                     "amounts_stride": "i64", "n_amounts": "i32", "ids_ptr": "*i64", "lowered_ptr": logits_type,
                     "out_stride": "i64", "width": "i32", "cap": "i32", "largest": "fp32", "BLOCK": "constexpr",
                     "TAIL": "constexpr", "LOG_S": "constexpr", "DRAFTS": "constexpr", "F64": "constexpr",
                     "BF16": "constexpr", "HAS_FLOOR": "constexpr"}
        for capability in (90, 80):
            for drafts, floor in ((False, False), (True, False), (True, True)):
                constexprs = {"BLOCK": dry.BLOCK, "TAIL": 256, "LOG_S": 17, "DRAFTS": drafts,
                              "F64": logits_type == "*fp64", "BF16": logits_type == "*bf16", "HAS_FLOOR": floor}
                source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
                compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                assert "decide_rows" in compiled.asm["ptx"]
