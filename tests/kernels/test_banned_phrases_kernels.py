"""``banned_phrases``' fused op (``dynlogits::banned_phrases_ban_``, ``dynlogits.kernels.banned_phrases``):
its CPU implementation (``ban_reference``) against the group's eager device path and the hosted
processor on random steps of a real ``BannedPhrasesGroup`` (phrases of 1 to 40 tokens, drafts or
not, rows outside the group, prefill rows, per-row floors: a scoped entry's stretch), the group's V2
step through the op, floored or not; a NaN logit's fate
on each path; its Triton kernel in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in a
subprocess before Triton is imported) against the CPU implementation bit for bit, and the CUDA
gate's probe passing there; the kernel compiled ahead of time for sm_90 and sm_80; the gate's
fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from fused_gates import a_failed_probe_falls_back

from dynlogits.kernels import banned_phrases as K
from dynlogits.processors import banned_phrases
from dynlogits.processors.slots import StepInputs
from dynlogits.testing.cuda.banned_phrases_check import _host, _hosted_rows, eager, fused_args, group_case

CPU = torch.device("cpu")


@pytest.mark.parametrize("floors", [False, True], ids=["unscoped", "floors"])
@pytest.mark.parametrize("drafts", [0, 2, 3])
def test_the_cpu_implementation_equals_the_eager_device_path_and_the_hosted_processor(drafts: int, floors: bool) -> None:
    """With floors, each decided row against the hosted processor on its stretch (a prefix crossing
    the floor matches nothing; a row whose floor is past it masks nothing, one-token phrases included)."""
    beyond = 0
    for seed in range(60):
        case = group_case(seed, CPU, requests=1 + seed % 11, drafts=drafts, longest=(2, 5, 9, 40)[seed % 4],
                          floors=floors)
        by_eager, pristine = case.logits.clone(), case.logits.clone()
        eager(case, by_eager)
        host = _host(case, case.logits)
        assert torch.equal(host, by_eager), (seed, drafts)
        assert torch.equal(case.logits, pristine), "the host reference writes its own copy"
        assert _hosted_rows(case, host) == 0, (seed, drafts)
        beyond += sum(len(w) > 0 for w in case.wants if w is not None)
    assert beyond > 40  # rows whose output ends with a prefix, so a phrase's last token is masked


class _On:
    """A gate that always runs the fused op (``FusedGate``'s answer in the CUDA model)."""

    def ready(self, device: object) -> bool:
        return True

    def run(self, device: object, fused: Callable[[], None], eager: object) -> None:
        fused()

    def run_named(self, device: object, fused: Callable[[], None], eager: object, *named: object) -> None:
        fused()


@pytest.mark.parametrize("drafts", [0, 2])
def test_the_group_step_through_the_op_masks_what_the_hosted_processor_masks(
        drafts: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(banned_phrases, "GATE", _On())
    for seed in range(30):
        case = group_case(seed, CPU, requests=1 + seed % 7, drafts=drafts, longest=(3, 12)[seed % 2])
        window = case.window
        if not drafts:  # a token matrix the CPU route does not read (not contiguous): the op decides
            window.tokens = torch.stack([window.tokens, window.tokens], dim=2)[:, :, 0]
        logits = case.logits.clone()
        step = StepInputs(logits, logits.view(-1), logits.shape[1], None, torch.empty(0, dtype=torch.long))
        decided = case.group.decide_from_window(case.rows, window)
        assert decided is banned_phrases._FUSED_STEP
        case.group.apply_device_decisions(step, case.rows, decided)
        assert _hosted_rows(case, logits) == 0, (seed, drafts)
        assert torch.equal(logits, _host(case, case.logits)), (seed, drafts)


@pytest.mark.parametrize("drafts", [0, 2])
def test_the_groups_floored_step_masks_what_the_hosted_processor_masks_on_each_rows_stretch(drafts: int) -> None:
    """``apply_floored`` (a scoped entry under Model Runner V2) on the CPU: the op's CPU
    implementation, each row the hosted processor's on its stretch, the rest untouched."""
    masked = 0
    for seed in range(30):
        case = group_case(seed, CPU, requests=1 + seed % 7, drafts=drafts, longest=(3, 12)[seed % 2], floors=True)
        assert case.floor is not None
        logits = case.logits.clone()
        step = StepInputs(logits, logits.view(-1), logits.shape[1], None, torch.empty(0, dtype=torch.long))
        case.group.apply_floored(step, case.rows, case.window, case.floor)
        assert _hosted_rows(case, logits) == 0, (seed, drafts)
        assert torch.equal(logits, _host(case, case.logits)), (seed, drafts)
        masked += int(torch.isneginf(logits).sum())
    assert masked > 20


def test_a_nan_logit_is_minus_inf_where_the_op_and_the_host_path_ban_it_and_stays_nan_on_the_eager_path() -> None:
    case = group_case(3, CPU, requests=6)
    banned_rows = [r for r, w in enumerate(case.wants) if w]
    assert banned_rows
    row = banned_rows[0]
    ban = case.wants[row][0]  # type: ignore[index]  # a decided row's
    logits = case.logits.clone()
    logits[row, ban] = float("nan")
    by_op, by_eager = logits.clone(), logits.clone()
    K.ban_reference(*fused_args(case, by_op))
    eager(case, by_eager)
    assert torch.isneginf(by_op[row, ban])  # as the hosted path's ``index_fill_``
    assert torch.isnan(by_eager[row, ban])  # ``scatter_reduce_(amin)`` keeps a NaN
    by_op[row, ban] = by_eager[row, ban] = 0.0
    assert torch.equal(by_op, by_eager)  # that cell is the only difference


SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import banned_phrases as K
    from dynlogits.testing.cuda import banned_phrases_check as C

    checked = banned = 0
    for seed in range(20):
        for drafts in (0, 2):
            for width in (1, 2, 5, 8, 9, 33, 40):
                dtype = torch.bfloat16 if seed % 3 == 2 else torch.float32
                case = K.probe_case(seed, rows=1 + seed % 13, drafts=drafts, width=width, entries=1 + seed % 40,
                                    floors=seed % 2 == 1)
                logits = case.logits.to(dtype)
                fused, host = logits.clone(), logits.clone()
                if seed % 4 == 1:  # a strided view of wider logits
                    fused = torch.stack([logits, logits], dim=2).view(len(logits), -1)[:, ::2]
                    assert fused.stride(1) == 2 and torch.equal(fused, logits)
                if seed % 5 == 3:  # int64 tokens
                    case = case._replace(tokens=case.tokens.long())
                K.launch(fused, *case[1:])
                K.ban_reference(host, *case[1:])
                assert torch.equal(fused, host), (seed, drafts, width)
                banned += int(host.isneginf().sum())
                checked += 1
    for seed in range(16):  # a real group's tables: phrases of 1 to 40 tokens
        for drafts in (0, 3):
            case = C.group_case(seed, torch.device("cpu"), requests=1 + seed % 9, drafts=drafts,
                                longest=(4, 40)[seed % 2], floors=seed % 4 > 1)
            fused = case.logits.clone()
            C.fused(case, fused)
            assert torch.equal(fused, C._host(case, case.logits)), (seed, drafts, "group")
            assert C._hosted_rows(case, fused) == 0, (seed, drafts, "hosted")
            checked += 1
    assert banned > 500, banned
    assert K._probe(torch.device("cpu")), "the gate's probe (kernel against ban_reference)"
    print("checked", checked)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_cpu_implementation_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 312" in done.stdout


@pytest.mark.parametrize("logits_type", ["*fp32", "*bf16"])
def test_the_triton_kernel_compiles_for_cuda_without_a_gpu(logits_type: str) -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, both column
    blocks, drafts or not, int32 and int64 tokens, floors or not): what the interpreter does not
    check (types, the compiler's lowering); not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = K.kernels().ban_rows
    for capability in (90, 80):
        for width in (5, 40):
            for drafts in (False, True):
                for tokens_type in ("*i32", "*i64"):
                    floors = (tokens_type == "*i64") != drafts  # each with and without drafts, both widths
                    signature = {"logits_ptr": logits_type, "logits_s0": "i64", "logits_s1": "i64",
                                 "tokens_ptr": tokens_type, "tokens_s0": "i64", "tokens_s1": "i64", "maxlen": "i32",
                                 "engine_slots": "i32", "prompt_ptr": "*i32", "pos_ptr": "*i64", "slot_ptr": "*i64",
                                 "member_ptr": "*u8", "prefix_ptr": "*i32", "prefix_s0": "i64", "bans_ptr": "*i64",
                                 "bans_s0": "i64", "need_ptr": "*i64", "need_s0": "i64", "ids_ptr": "*i32",
                                 "local_ptr": "*i64", "floor_ptr": "*i64", "entries": "i32", "width": "i32",
                                 "vocab": "i32", "BLOCK_E": "constexpr", "BLOCK_W": "constexpr",
                                 "HAS_DRAFTS": "constexpr", "HAS_FLOOR": "constexpr"}
                    constexprs = {"BLOCK_E": K.BLOCK_E, "BLOCK_W": K.block_width(width), "HAS_DRAFTS": drafts,
                                  "HAS_FLOOR": floors}
                    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
                    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                    assert "ban_rows" in compiled.asm["ptx"]


def test_the_op_declares_one_launch_and_a_failed_probe_falls_back_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from dynlogits.kernels.fused import registered

    assert registered()["dynlogits::banned_phrases_ban_"].launches == 1  # ban_rows
    a_failed_probe_falls_back(monkeypatch, caplog, K, "_probe", "banned_phrases")
