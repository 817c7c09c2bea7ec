"""The watermark's Triton kernels (``dynlogits.kernels.watermark``) in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported) against the eager reference:
the uniforms (integer Philox, the 24-bit mantissa, the float64 division) and the absorbed states bit
for bit, the scores bit for bit against the same float32 formula in numpy (the interpreter's ``log``
is numpy's, not torch's: only a GPU checks the kernels' ``log`` against torch's CUDA ``log``), the
tokens (ties: the lowest index; NaN first) and the forced rows equal to the eager draw's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import numpy as np
    import torch
    from dynlogits.kernels import watermark as K
    from dynlogits.processors import watermark_prf as P
    from dynlogits.processors.watermark_compiled import batched_draw, fused_draw_force_

    def case(n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        states = torch.randint(0, 2**32, (n, 4), generator=g, dtype=torch.int64)
        params = torch.randint(0, 2**32, (n + 3, 4), generator=g, dtype=torch.int64)
        slots = torch.randperm(n + 3, generator=g)[:n]
        temperature = torch.rand(n + 3, 1, generator=g) * 2 + 0.05
        logits = torch.randn(n + 2, vocab, generator=g) * 4
        logits[0, :] = 1.0                      # ties over the whole row
        logits[1, vocab // 3 :: 7] = float("-inf")
        logits[2, :] = float("-inf")            # an empty row: token 0, kept -inf
        if n > 3:
            logits[3, vocab - 1] = float("nan")  # NaN wins, as torch.argmax
        rows = torch.randperm(n + 2, generator=g)[:n]
        return logits, rows, slots, temperature, params, states

    checked = 0
    for n, vocab, seed in [(64, 1000, 1), (5, 2500, 2), (3, 1024, 3), (7, 97, 4)]:
        logits, rows, slots, temperature, params, states = case(n, vocab, seed)
        uniforms = torch.empty(n, vocab)
        scores = torch.empty(n, vocab)
        tokens = K.draw(logits, rows, slots, temperature, params, states.T.contiguous().T, None, False,
                        scores=(uniforms, scores))
        eager_u = P.uniform_from_states(states, params[slots, :2], vocab)
        assert torch.equal(uniforms.view(torch.int32), eager_u.view(torch.int32)), "uniform bits"
        x = logits[rows].numpy() / temperature[slots].numpy()
        u = np.maximum(eager_u.numpy(), np.finfo(np.float32).tiny)
        expected = x + (-np.log(-np.log(u)))
        assert np.array_equal(scores.numpy().view(np.int32), expected.astype(np.float32).view(np.int32)), "score bits"
        assert torch.equal(tokens, torch.from_numpy(expected).argmax(1)), "tokens vs numpy scores"
        assert torch.equal(tokens, batched_draw(logits[rows], temperature[slots, 0], states, params[slots, :2])), "tokens vs eager"
        # the draw and its forcing, every row or the firing ones, against the op's eager reference
        fire = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed))
        for f in (None, fire):
            a, b = logits.clone(), logits.clone()
            ta = K.draw(a, rows, slots, temperature, params, states, f, True)
            tb = fused_draw_force_.eager(b, rows, slots, temperature, params, states, f)
            assert torch.equal(ta, tb) and torch.equal(a.isnan(), b.isnan())
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)), "forced rows"
            forced = rows if f is None else rows[f != 0]
            off_token = torch.ones_like(a[forced], dtype=torch.bool).scatter_(1, (ta if f is None else ta[f != 0])[:, None], False)
            assert bool(a[forced][off_token].isneginf().all()), "a forced row is -inf over its whole width"
        checked += 1
    for n, width, seed in [(70, 4, 5), (9, 7, 6), (3, 1, 7), (65, 12, 8)]:
        g = torch.Generator().manual_seed(seed)
        keys = torch.randint(0, 2**32, (n, 4), generator=g, dtype=torch.int64)[:, 1:3]  # a strided view
        contexts = torch.randint(-1, 2**31 - 1, (n, width), generator=g)
        widths = torch.randint(0, width + 1, (n + 1, 2), generator=g)[:n, 1]
        for w in (None, widths):
            assert torch.equal(K.absorb(keys, contexts, w), P.absorb(keys, contexts, w)), "absorb"
        checked += 1
    print("checked", checked)
''')


def test_the_triton_kernels_in_the_interpreter_equal_the_eager_reference_bit_for_bit() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 8" in done.stdout


WINDOW_SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import watermark as K
    from dynlogits.processors.watermark_compiled import _probe, fused_window_state
    from dynlogits.testing.cuda.watermark_check import window_cases

    checked = draws = 0
    for case in window_cases():
        want = fused_window_state.eager(*case)
        tokens, rest = case[0], case[1:]
        for matrix in (tokens, tokens.T.contiguous().T):  # the runner's matrix, and one with other strides
            got = K.window_state(matrix, *rest)
            assert got.dtype == torch.int64 and torch.equal(got, want), (checked, want, got)
        for rows, block in ((4, 64), (2, 16)):  # several rows a program, spans of several scan blocks
            got = K.window_state(tokens, *rest, rows_per_program=rows, block=block)
            assert torch.equal(got, want), (checked, rows, block, want, got)
        draws += int(want[:, 4].sum())
        checked += 1
    assert 0 < draws
    assert _probe(torch.device("cpu"))  # the gate's probe: every fused op against its eager reference
    print("checked", checked)
''')


def test_the_window_kernel_in_the_interpreter_equals_the_eager_decisions_bit_for_bit() -> None:
    """``window_state`` (read, placeholder, repeat, absorb in one kernel) against the op's eager
    reference on ``watermark_check.window_cases`` (repeats, short histories, placeholders, drafts,
    prompt boundaries, a sentinel row, spans of one and several scan blocks), then the gate's probe
    (``watermark_compiled._probe``) through the interpreted kernels."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", WINDOW_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 12" in done.stdout


def _compile_for_cuda(kernel: Any, signature: dict[str, str], constexprs: dict[str, Any], capability: int) -> str:
    """``kernel`` compiled ahead of time by Triton's NVIDIA backend (no GPU needed): its PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return str(triton.compile(source, target=GPUTarget("cuda", capability, 32)).asm["ptx"])


def test_every_watermark_kernel_compiles_for_cuda_without_a_gpu() -> None:
    """Triton's NVIDIA backend compiles each kernel for Hopper and Ampere (the window kernel at
    widths 1, 4, 5 and 32, mixed or not, drafts or not): what the interpreter does not check (a
    Python list in a kernel, for one, runs interpreted and fails to compile); not run."""
    triton = pytest.importorskip("triton")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    from dynlogits.kernels import watermark as kernels

    k = kernels.kernels()
    i64, i32 = "i64", "i32"
    draw = {"logits_ptr": "*fp32", "logits_stride": i64, "rows_ptr": "*i64", "slots_ptr": "*i64", "temp_ptr": "*fp32",
            "temp_stride": i64, "params_ptr": "*i64", "params_stride": i64, "states_ptr": "*i64", "states_stride0": i64,
            "states_stride1": i64, "best_ptr": "*fp32", "index_ptr": "*i32", "kept_ptr": "*fp32", "vocab": i32,
            "nblocks": i32, "u_ptr": "*fp32", "score_ptr": "*fp32", "BLOCK": "constexpr", "SCORES": "constexpr"}
    reduce = {"logits_ptr": "*bf16", "logits_stride": i64, "rows_ptr": "*i64", "fire_ptr": "*i64", "best_ptr": "*fp32",
              "index_ptr": "*i32", "kept_ptr": "*fp32", "tokens_ptr": "*i64", "vocab": i32, "nblocks": i32,
              "BLOCK": "constexpr", "NB": "constexpr", "HAS_FIRE": "constexpr", "FORCE": "constexpr"}
    absorb = {"keys_ptr": "*i64", "keys_stride": i64, "keys_stride1": i64, "ctx_ptr": "*i64", "ctx_stride": i64,
              "ctx_stride1": i64, "widths_ptr": "*i64", "widths_stride": i64, "out_ptr": "*i64", "n": i32,
              "WIDTH": "constexpr", "HAS_WIDTHS": "constexpr", "ROWS": "constexpr"}
    window = {"tokens_ptr": "*i32", "tokens_stride0": i64, "tokens_stride1": i64, "n_slots": i32, "n_cols": i32,
              "prompt_ptr": "*i32", "pos_ptr": "*i64", "input_ptr": "*i32", "local_ptr": "*i32", "slot_ptr": "*i32",
              "member_ptr": "*u8", "params_ptr": "*i64", "params_stride0": i64, "params_stride1": i64, "out_ptr": "*i64",
              "n": i32, "span": i32, "max_history": i32, "WIDE": "constexpr", "EVERY": "constexpr",
              "DRAFTS": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"}
    builds: list[tuple[Any, dict[str, str], dict[str, Any], int]] = []
    for capability in (90, 80):
        builds += [(k.draw_blocks, draw, {"BLOCK": kernels.BLOCK, "SCORES": False}, capability),
                   (k.draw_reduce, reduce, {"BLOCK": kernels.BLOCK, "NB": 256, "HAS_FIRE": True, "FORCE": True}, capability),
                   (k.absorb_rows, absorb, {"WIDTH": 6, "HAS_WIDTHS": True, "ROWS": kernels.ROWS}, capability),
                   (k.window_decide, window, {"WIDE": 4, "EVERY": True, "DRAFTS": True, "ROWS": kernels.WINDOW_ROWS,
                                              "BLOCK": kernels.WINDOW_BLOCK}, capability)]
    for wide, every, drafts in [(1, True, False), (5, False, True), (32, False, False), (4, True, False)]:
        builds.append((k.window_decide, window, {"WIDE": wide, "EVERY": every, "DRAFTS": drafts, "ROWS": 4, "BLOCK": 256}, 90))
    for kernel, signature, constexprs, capability in builds:
        assert kernel.__name__ in _compile_for_cuda(kernel, signature, constexprs, capability), (kernel.__name__, constexprs)
