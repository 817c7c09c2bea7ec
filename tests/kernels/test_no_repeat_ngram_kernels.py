"""``no_repeat_ngram``'s fused op (``no_repeat_ngram_device.ban_``): its CPU implementation
(``ban_host``, and ``apply``'s CPU path) against the eager device path (``apply_eager``, run on the
CPU) on random steps, and
against transformers' ``NoRepeatNGramLogitsProcessor`` (``banned_after`` where a history holds a
placeholder or an id past the logits) on random histories, drafts included, and with a scoped
entry's per-row floor against ``banned_after`` of each row's stretch; its Triton kernel in
Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported)
against the CPU implementation bit for bit, and the CUDA gate's probe passing there. The CPU
implementation's tests run on both of its paths: compiled (``no_repeat_ngram_native``, steps
without drafts) and numpy."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from dynlogits.processors import no_repeat_ngram_device, no_repeat_ngram_native
from dynlogits.processors.no_repeat_ngram import banned_after
from dynlogits.processors.no_repeat_ngram_device import (
    MAX_DEVICE_SIZE,
    apply,
    apply_eager,
    ban_host,
    layout,
    probe_case,
    slot_tables,
    window_width,
)
from dynlogits.processors.window import TokenWindow

CPU = torch.device("cpu")
EXTREMES = (torch.tensor(float("-inf")), torch.tensor(float("inf")))


@pytest.fixture(params=["native", "numpy"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The CPU implementation compiled (where this machine builds it) or numpy; yields the count of
    steps the compiled one took (``-1``: numpy)."""
    taken = [0]
    if request.param == "numpy":
        taken[0] = -1
        monkeypatch.setattr(no_repeat_ngram_device, "ban_native", lambda *args: False)
    else:
        if shutil.which("cc") is None:
            pytest.skip("no C compiler (cc) on this machine")
        assert no_repeat_ngram_native.library(wait=True) is not None, "the native step did not build with this machine's cc"

        def counted(*args: Any) -> bool:
            done = no_repeat_ngram_native.ban_native(*args)
            taken[0] += done
            return done

        monkeypatch.setattr(no_repeat_ngram_device, "ban_native", counted)
    yield taken


def _host(logits: torch.Tensor, window: TokenWindow, slot_of_row: torch.Tensor, params: torch.Tensor, width: int,
          size: int, floor: torch.Tensor | None = None) -> None:
    drafts = window.input_ids is not None and window.local_pos is not None
    ban_host(logits, window.tokens, window.pos, slot_of_row, params, window.input_ids if drafts else None,
             window.local_pos if drafts else None, floor, width, size)


@pytest.mark.parametrize("floored", [False, True], ids=["whole", "floored"])
@pytest.mark.parametrize("drafts", [0, 2, 3])
def test_the_cpu_implementation_equals_the_eager_device_path(drafts: int, floored: bool, cpu_path: list[int]) -> None:
    banned = 0
    for seed in range(150):
        rows = 1 + seed % 17
        window, t, logits, floor = probe_case(seed, CPU, rows=rows, drafts=drafts)
        f = floor if floored else None
        eager, host = logits.clone(), logits.clone()
        apply_eager(window, t, eager, EXTREMES, f)
        _host(host, window, t.slot_of_row, t.source.params, t.source.width, t.source.size, f)
        assert torch.equal(host, eager), (seed, drafts)
        for _ in range(2):  # ``apply`` on the CPU: the same, its rows' params gathered at the first step
            applied = logits.clone()
            apply(window, t, applied, EXTREMES, f)
            assert torch.equal(applied, eager), (seed, drafts)
        banned += int(host.isneginf().sum())
    assert banned > 200  # the cases ban often
    assert cpu_path[0] in (-1, 0 if drafts else 450)  # compiled: every step without drafts (ban_host, apply twice)


def _transformers_bans(history: list[int], size: int, vocab: int) -> list[int]:
    from transformers import NoRepeatNGramLogitsProcessor

    scores = torch.zeros(1, vocab)
    out = NoRepeatNGramLogitsProcessor(size)(torch.tensor([history]), scores)
    return torch.isneginf(out[0]).nonzero().flatten().tolist()


def _random_requests(rng: random.Random, most: int, kinds: list[int], prompts: int,
                     outputs: int) -> tuple[int, list[tuple[list[int], list[int], list[int], int]]]:
    """A step's largest size and its 1 to ``most`` requests: each a prompt (1 to ``prompts``
    tokens), an output (up to ``outputs``) and drafts (0 or 2) of 2 to 5 distinct ids (``kinds``'
    choice: n-grams repeat), and its own size."""
    size = rng.randint(1, MAX_DEVICE_SIZE)
    made = []
    for _ in range(rng.randint(1, most)):
        ids = [rng.randrange(2, 2 + rng.choice(kinds)) for _ in range(40)]
        prompt = [rng.choice(ids) for _ in range(rng.randint(1, prompts))]
        output = [rng.choice(ids) for _ in range(rng.randint(0, outputs))]
        made.append((prompt, output, [rng.choice(ids) for _ in range(rng.choice([0, 0, 2]))], rng.randint(1, size)))
    return size, made


def test_the_cpu_implementation_bans_what_transformers_bans(cpu_path: list[int]) -> None:
    """Requests of random sizes, prompts (counted or not) and outputs, some with drafts (one row
    per draft, as Model Runner V2 feeds them), some holding placeholders or ids past the logits."""
    pytest.importorskip("transformers")
    rng = random.Random(7)
    vocab, length, checked, compared = 12, 48, 0, 0
    for case in range(60):
        size, made = _random_requests(rng, 5, [2, 3, 5], 10, 20)
        requests = []
        for prompt, output, drafts, own in made:
            if rng.random() < 0.3:  # a placeholder or an id past the logits somewhere
                spot = rng.randrange(len(prompt) + len(output))
                bad = rng.choice([-1, vocab, vocab + 1])
                if spot < len(prompt):
                    prompt[spot] = bad
                else:
                    output[spot - len(prompt)] = bad
            requests.append((prompt, output, drafts, rng.random() < 0.5, own))
        slots = len(requests) + 1
        tokens = torch.full((slots, length), -7, dtype=torch.int32)  # not the history: never read as it
        prompt_len, pos, slot_of_row, input_ids, local_pos, want = [], [], [], [], [], []
        for slot, (prompt, output, drafts, with_prompt, own) in enumerate(requests):
            committed = prompt + output
            tokens[slot, :len(committed)] = torch.tensor(committed, dtype=torch.int32)
            prompt_len.append(len(prompt))
            for k in range(len(drafts) + 1):  # row k: fed the last committed token (k = 0), then draft k
                history = (prompt if with_prompt else []) + output + drafts[:k]
                pos.append(len(committed) - 1 + k)
                slot_of_row.append(slot)
                input_ids.append(committed[-1] if k == 0 else drafts[k - 1])
                local_pos.append(k)
                want.append((history, own))
        prompt_len.append(1)
        tokens[:, length - 1] = 3  # the matrix's last column: garbage a wrapped read must not take for history
        fed = not any(local_pos)  # no drafts: a window without them (the compiled step's)
        window = TokenWindow(CPU).at(tokens, torch.tensor(prompt_len, dtype=torch.int32), torch.tensor(pos),
                                     None if fed else torch.tensor(input_ids, dtype=torch.int32),
                                     None if fed else torch.tensor(local_pos))
        member = torch.tensor([True] * len(requests) + [False])
        params = torch.tensor([[own, int(with_prompt)] for _, _, _, with_prompt, own in requests] + [[1, 0]])
        spans = [len(p) + len(o) + len(d) if w else len(o) + len(d) for p, o, d, w, _ in requests]
        width = window_width(length, list(spans), size)
        tables = slot_tables(window, member, params, width, size, vocab)
        logits = torch.zeros(len(pos), vocab)
        _host(logits, window, torch.tensor(slot_of_row), tables.params, width, size)
        eager = torch.zeros(len(pos), vocab)
        apply_eager(window, layout(tables, torch.tensor(slot_of_row)), eager, EXTREMES)
        assert torch.equal(logits, eager), case
        for row, (history, own) in enumerate(want):
            got = torch.isneginf(logits[row]).nonzero().flatten().tolist()
            expected = sorted(t for t in banned_after(history, own) if t < vocab)
            assert got == expected, (case, row, history, own)
            if history and all(0 <= t < vocab for t in history):
                assert got == _transformers_bans(history, own, vocab), (case, row, history, own)
                compared += 1
            checked += bool(got)
    assert checked > 50 and compared > 100
    assert cpu_path[0] == -1 or cpu_path[0] >= 10  # the premise: steps without drafts ran compiled


SCRIPT = textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    from dynlogits.kernels import no_repeat_ngram as K
    from dynlogits.processors import no_repeat_ngram_device as D

    checked = banned = 0
    for seed in range(24):
        for drafts in (0, 2):
            for dtype in (torch.float32, torch.bfloat16):
                window, t, logits, floor = D.probe_case(seed, torch.device("cpu"), drafts=drafts, rows=3 + seed % 9)
                logits = logits.to(dtype)
                fused, host = logits.clone(), logits.clone()
                if seed % 4 == 1:  # a strided view of wider logits
                    fused = torch.stack([logits, logits], dim=2).view(len(logits), -1)[:, ::2]
                    assert fused.stride(1) == 2 and torch.equal(fused, logits)
                drafted = drafts > 0
                args = (window.tokens, window.pos, t.slot_of_row, t.source.params,
                        window.input_ids if drafted else None, window.local_pos if drafted else None,
                        floor if seed % 3 else None, t.source.width, t.source.size)
                K.ban_(fused, *args)
                D.ban_host(host, *args)
                assert torch.equal(fused, host), (seed, drafts, dtype)
                banned += int(host.isneginf().sum())
                checked += 1
    wide = 0
    for seed in range(100, 140):  # windows wider than a program's block of followers
        for drafts in (0, 2):
            window, t, logits, floor = D.probe_case(seed, torch.device("cpu"), drafts=drafts, rows=4, length=300)
            if t.source.width - t.source.size + 1 <= K.BLOCK or wide == 8:
                continue
            wide += 1
            fused, host = logits.clone(), logits.clone()
            drafted = drafts > 0
            args = (window.tokens, window.pos, t.slot_of_row, t.source.params,
                    window.input_ids if drafted else None, window.local_pos if drafted else None,
                    floor if seed % 2 else None, t.source.width, t.source.size)
            K.ban_(fused, *args)
            D.ban_host(host, *args)
            assert torch.equal(fused, host), (seed, drafts, "wide")
            banned += int(host.isneginf().sum())
            checked += 1
    assert banned > 100, banned
    assert D._probe(torch.device("cpu")), "the gate's probe (kernel against apply_eager)"
    print("checked", checked)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_cpu_implementation_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 104" in done.stdout


@pytest.mark.parametrize("logits_type", ["*fp32", "*bf16"])
def test_the_triton_kernel_compiles_for_cuda_without_a_gpu(logits_type: str) -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, every size,
    drafts or not): what the interpreter does not check (types, the compiler's lowering); not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import no_repeat_ngram

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    kernel = no_repeat_ngram.kernels().ban_rows
    signature = {"logits_ptr": logits_type, "logits_s0": "i64", "logits_s1": "i64", "tokens_ptr": "*i32",
                 "tokens_s0": "i64", "tokens_s1": "i64", "maxlen": "i32", "pos_ptr": "*i64", "slot_ptr": "*i64",
                 "params_ptr": "*i64", "params_s0": "i64", "ids_ptr": "*i32", "local_ptr": "*i64", "floor_ptr": "*i64",
                 "width": "i32", "vocab": "i32", "SIZE": "constexpr", "BLOCK": "constexpr", "HAS_DRAFTS": "constexpr",
                 "HAS_FLOOR": "constexpr"}
    for capability in (90, 80):
        for size in range(1, MAX_DEVICE_SIZE + 1):
            for drafts, floor in ((False, False), (True, False), (False, True), (True, True)):  # floor: a scoped entry
                source = ASTSource(fn=kernel, signature=signature,
                                   constexprs={"SIZE": size, "BLOCK": no_repeat_ngram.BLOCK, "HAS_DRAFTS": drafts,
                                               "HAS_FLOOR": floor})
                compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                assert "ban_rows" in compiled.asm["ptx"]


def test_the_op_declares_one_launch_and_a_failed_probe_falls_back_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from dynlogits.kernels.fused import registered
    from dynlogits.processors import no_repeat_ngram_device as D

    assert registered()["dynlogits::no_repeat_ngram_ban_"].launches == 1  # ban_rows
    probed: list[torch.device] = []

    def differing(device: torch.device) -> bool:
        probed.append(device)
        return False  # the kernel's logits differ from apply_eager's

    monkeypatch.setattr(D, "_probe", differing)
    D.reset_fused()
    try:
        with caplog.at_level("WARNING", logger="dynlogits.kernels"):
            answers = [D.fused_ready(torch.device("cuda", 0)) for _ in range(3)]
        assert answers == [False] * 3 and len(probed) == 1  # probed once per device
        warned = [r.getMessage() for r in caplog.records if "fused Triton kernels are off" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith("no_repeat_ngram")
        assert D.fused_ready(CPU) is False and D.fused_ready(torch.device("meta")) is True
    finally:
        D.reset_fused()


def test_a_floor_bans_what_the_reference_bans_on_the_rows_stretch_on_every_path(cpu_path: list[int]) -> None:
    """A scoped entry's rows (``apply`` with a per-row floor): on the CPU (``ban_``'s CPU
    implementation) and on the eager device path, run on the CPU, each row bans exactly
    ``banned_after`` of its stretch (the output from ``max(floor, prompt_len)`` on, up to the row,
    drafts included; nothing past every position), bit for bit, the other logits untouched."""
    rng = random.Random(11)
    vocab, length, banned, stretched = 12, 40, 0, 0
    for case in range(80):
        size, requests = _random_requests(rng, 4, [2, 3], 6, 24)
        for _, output, _, _ in requests:
            if output and rng.random() < 0.2:
                output[rng.randrange(len(output))] = rng.choice([-1, vocab])
        tokens = torch.full((len(requests) + 1, length), -7, dtype=torch.int32)
        prompt_len, pos, slot_of_row, input_ids, local_pos, floors, want = [], [], [], [], [], [], []
        for slot, (prompt, output, drafts, own) in enumerate(requests):
            committed = prompt + output
            tokens[slot, :len(committed)] = torch.tensor(committed, dtype=torch.int32)
            prompt_len.append(len(prompt))
            for k in range(len(drafts) + 1):
                end = len(committed) + k  # the row's history: positions up to end - 1, drafts fed before it
                floor = rng.choice([0, len(prompt), rng.randint(len(prompt), end), end, 1 << 62])
                seen = output + drafts[:k]
                stretch = seen[max(floor, len(prompt)) - len(prompt):] if floor < (1 << 62) else None
                pos.append(end - 1)
                slot_of_row.append(slot)
                input_ids.append(committed[-1] if k == 0 else drafts[k - 1])
                local_pos.append(k)
                floors.append(floor)
                want.append((stretch, own))
        prompt_len.append(1)
        fed = not any(local_pos)  # no drafts: a window without them (the compiled step's)
        window = TokenWindow(CPU).at(tokens, torch.tensor(prompt_len, dtype=torch.int32), torch.tensor(pos),
                                     None if fed else torch.tensor(input_ids, dtype=torch.int32),
                                     None if fed else torch.tensor(local_pos))
        member = torch.tensor([True] * len(requests) + [False])
        params = torch.tensor([[own, 0] for *_, own in requests] + [[1, 0]])
        width = window_width(length, [len(o) + len(d) for _, o, d, _ in requests], size)
        t = layout(slot_tables(window, member, params, width, size, vocab), torch.tensor(slot_of_row))
        logits = torch.randn(len(pos), vocab)
        host, eager = logits.clone(), logits.clone()
        apply(window, t, host, EXTREMES, torch.tensor(floors))
        apply_eager(window, t, eager, EXTREMES, torch.tensor(floors))
        assert torch.equal(host, eager), case
        for row, (stretch, own) in enumerate(want):
            expected = [] if stretch is None else sorted(t for t in banned_after(stretch, own) if t < vocab)
            assert torch.isneginf(host[row]).nonzero().flatten().tolist() == expected, (case, row, stretch, own)
            kept = ~torch.isneginf(host[row])
            assert torch.equal(host[row][kept], logits[row][kept])
            banned += bool(expected)
            stretched += stretch is not None and len(stretch) < len(requests[slot_of_row[row]][1])
    assert banned > 40 and stretched > 40
    assert cpu_path[0] == -1 or cpu_path[0] >= 10  # the premise: steps without drafts ran compiled
