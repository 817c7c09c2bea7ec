"""``watermark``'s compiled draw on a real CUDA device (``check.py``'s watermark section).

``python -m dynlogits.testing.cuda.check --watermark-only`` (or the whole check) runs ``run`` on the
GPU; ``python -m dynlogits.testing.cuda.watermark_check --cpu`` is its CPU self test (the same
comparisons between the eager reference and the pure function compiled for the CPU, small vocab;
no profiler, sync or timing figures). Figures, one line each:

* ``compile``: the first compiled draw's wall time, the Inductor options in effect, or why it fell
  back to eager (then every later figure is FAILED);
* ``bits``: per batch (1, 64, 256) and logits dtype, over random rows (some masked with ``-inf``),
  64-bit keys, contexts (widths 1..9, ``-1`` before the output) and temperatures: the compiled
  draw's tokens against the eager draw's on the same device and against the CPU eager draw's
  (rows differing, each must be 0), and the uniforms' bits on the device against the CPU's;
* ``V1 draw``: the V1 runner's compiled step (``listed_draw``: row gathers, draw, the kept value)
  against its eager run on the device and on the CPU (index and value bits);
* ``absorb``: the device's ``absorb`` of every context against the host's ``context_state``;
* ``window decisions``: Model Runner V2's compiled context/repeat/absorb step (``window_decisions``)
  against its eager run on the device and on the CPU (span ``MAX_HISTORY + 4``; 64 on the CPU);
  its device ops and time are printed, not judged (the eager read of the window precedes it);
* ``kernels``: device ops (kernels, copies, memsets) of one steady compiled draw after warm-up,
  from ``torch.profiler``, beside the eager draw's (the kind's launch budget: <= 8 a step);
* ``sync``: one call of each compiled function (draw, V1 draw, window decisions) under
  ``torch.cuda.set_sync_debug_mode("error")``, after warm-up;
* ``time``: per draw, compiled and eager (CUDA events over ``steps`` draws).

The fused Triton kernels (``dynlogits.kernels.watermark``, what the resident group runs on CUDA
by default), ``run_fused``: ``fused bits`` (per batch: the draw-and-force kernels' tokens and forced
rows, and the absorb's states, against the eager reference on the same device, exactly; then
``fused window bits``: Model Runner V2's window kernel, ``window_state``, against the op's eager
reference on ``window_cases`` and runner-sized windows, ``MAX_HISTORY`` and drafts), ``fused
kernels`` (device ops of one steady call from ``torch.profiler``: 2 for the draw, 1 for the
absorb, 1 for the window decisions), ``fused sync`` (under ``set_sync_debug_mode("error")``) and
``fused time`` (the draw, and the window decisions over a ``MAX_HISTORY + 4`` span). With ``--cpu``
(here and in ``check.py``) the same bit comparisons run in Triton's interpreter
(``TRITON_INTERPRET=1``, a subprocess): the integer bits are the kernels'; the float ops are
numpy's (its ``log`` is not torch's), so only the GPU run checks the float bits against torch."""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dynlogits.processors import watermark_compiled
from dynlogits.processors.sampling import SamplingView
from dynlogits.processors.watermark_compiled import listed_draw, window_decisions
from dynlogits.processors.watermark_prf import absorb, context_state, key_words, uniform_from_states
from dynlogits.processors.watermark_resident import MAX_HISTORY, batched_draw

from .timing import device_ops, sync_error, timed

__all__ = ["BATCHES", "PAYLOADS", "SAMPLING", "Inputs", "compare", "fused_bits", "fused_inputs", "history_edge_case",
           "interpreted_check", "main", "make_inputs", "run", "run_fused", "window_bits", "window_case", "window_cases"]

BATCHES = (1, 64, 256)
KERNEL_BUDGET = 8

#: ``check.measure``'s payloads of this kind (one entry a request, a distinct key a row) and the
#: sampling they are realized with (a temperature: resident, drawing every step)
PAYLOADS: dict[str, Callable[[int, int], list[dict[str, Any]]]] = {
    "watermark": lambda v, i: [{"kind": "watermark", "key": 2**64 - 1 - 7919 * i, "context_width": 4}],
}
SAMPLING = SamplingView(temperature=0.8)

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_inputs(batch: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[Inputs, list[int], list[list[int]]]:
    """Random ``(rows, temperatures, states, keys)`` on the CPU (states from ``context_state`` of
    random contexts, as the V1 runner's host decides), the keys and the contexts."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(batch, vocab, generator=gen) * rng.choice([1.0, 4.0, 20.0])
    for i in range(batch):
        if rng.random() < 0.3:  # a masked row, as after a grammar or ban
            rows[i, torch.rand(vocab, generator=gen) < rng.random()] = -torch.inf
    temperatures = torch.tensor([rng.choice([1.0, rng.uniform(0.05, 2.0)]) for _ in range(batch)], dtype=torch.float32)
    keys = [rng.choice([rng.getrandbits(64), 2**64 - 1 - rng.getrandbits(8), rng.getrandbits(32)]) for _ in range(batch)]
    contexts = []
    for _ in range(batch):
        width = rng.randint(1, 9)
        before = rng.randint(0, width) if rng.random() < 0.2 else 0
        contexts.append([-1] * before + [rng.randrange(vocab) for _ in range(width - before)])
    states = torch.tensor([context_state(k, c) for k, c in zip(keys, contexts)], dtype=torch.int64).reshape(batch, 4)
    words = torch.tensor([key_words(k) for k in keys], dtype=torch.int64).reshape(batch, 2)
    return (rows.to(dtype), temperatures, states, words), keys, contexts


def _to(inputs: Inputs, device: torch.device) -> Inputs:
    rows, temperatures, states, keys = (t.to(device) for t in inputs)
    return rows, temperatures, states, keys


def compare(device: torch.device, compiled: Callable[..., torch.Tensor], *, vocab: int, batches: Sequence[int],
            dtypes: Sequence[torch.dtype], seed: int = 0) -> list[dict[str, Any]]:
    """For each batch and dtype: rows where ``compiled`` differs from the eager draw on ``device``
    and from the CPU's eager draw, and uniforms differing from the CPU's (bits)."""
    out = []
    for dtype in dtypes:
        for batch in batches:
            host, keys, contexts = make_inputs(batch, vocab, dtype, seed + batch)
            dev = _to(host, device)
            got = compiled(*dev).cpu()
            eager = batched_draw(*dev).cpu()
            cpu = batched_draw(*host)
            u_dev = uniform_from_states(dev[2], dev[3], vocab).cpu()
            u_cpu = uniform_from_states(host[2], host[3], vocab)
            out.append({"batch": batch, "dtype": str(dtype).removeprefix("torch."),
                        "vs_eager": int((got != eager).sum()), "vs_cpu": int((got != cpu).sum()),
                        "eager_vs_cpu": int((eager != cpu).sum()),
                        "uniform_bits": int((u_dev.view(torch.int32) != u_cpu.view(torch.int32)).sum())})
    return out


def _absorb_diffs(device: torch.device, seed: int = 1, n: int = 256) -> int:
    """Rows where the device's ``absorb`` differs from the host's ``context_state``."""
    rng = random.Random(seed)
    width = 9
    keys = [rng.getrandbits(64) for _ in range(n)]
    widths = [rng.randint(1, width) for _ in range(n)]
    contexts = [[rng.choice([-1, rng.randrange(151936)]) for _ in range(width)] for _ in range(n)]
    want = torch.tensor([context_state(k, c[:w]) for k, c, w in zip(keys, contexts, widths)], dtype=torch.int64)
    got = absorb(torch.tensor([key_words(k) for k in keys], dtype=torch.int64, device=device),
                 torch.tensor(contexts, dtype=torch.int64, device=device),
                 torch.tensor(widths, dtype=torch.int64, device=device)).cpu()
    return int((got != want).any(1).sum())


def window_inputs(n: int, wide: int, every: bool, seed: int, span: int) -> tuple[Any, ...]:
    """Random ``window_decisions`` arguments on the CPU (Model Runner V2's step): half the rows'
    tokens of a small vocabulary (repeats are common), half of a large one, placeholders, outputs starting inside the span or before it,
    mixed widths unless ``every``."""
    gen = torch.Generator().manual_seed(seed)
    small = torch.randint(0, 3 if wide >= 4 else 12, (n, span), generator=gen)
    large = torch.randint(0, 151936, (n, span), generator=gen)
    tokens = torch.where(torch.rand(n, 1, generator=gen) < 0.5, small, large)  # half the rows rarely repeat
    tokens[torch.rand(n, span, generator=gen) < 0.001] = -1
    pos = torch.randint(span - 5, span + 30, (n,), generator=gen)
    at = (pos - (span - 1))[:, None] + torch.arange(span)[None, :]
    prompt = torch.randint(0, span + 10, (n,), generator=gen)
    widths = torch.full((n,), wide) if every else torch.randint(1, wide + 1, (n,), generator=gen)
    keys = torch.randint(0, 2**32, (n, 2), generator=gen)
    params = torch.cat([keys, widths[:, None], torch.randint(0, 2, (n, 1), generator=gen)], dim=1)
    member = torch.rand(n, generator=gen) < 0.8
    return tokens, at, prompt, pos, params, member, torch.arange(wide)[None, :], wide, every, MAX_HISTORY


def window_case(seed: int, *, requests: int, columns: int, wide: int, every: bool, drafts: int,
                max_history: int, small: bool = True) -> tuple[Any, ...]:
    """Random ``fused_window_state`` arguments on the CPU (Model Runner V2's step, as the runner lays
    it out): ``requests`` requests in random slots of an int32 token matrix ``[slots, columns]``
    (a small vocabulary where ``small``: repeats are common; a few negative ids), prompts ending
    anywhere (outputs starting inside the span, before it, or not yet), ``drafts`` rows of drafts
    after each request's row (``input_ids``: the last committed token, then drafts, some ``-1``
    placeholders) or none (``input_ids``, ``local_pos`` ``None``), one sentinel row (the tables'
    last slot, past the matrix, not a member), widths ``1..wide`` unless ``every``, greedy and
    sampling slots, some non-member rows; then ``wide``, ``every``, ``max_history``."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_slots = requests + 2
    vocab = (3 if wide >= 4 else 12) if small else 151936
    tokens = torch.randint(0, vocab, (num_slots, columns), generator=gen, dtype=torch.int32)
    tokens[torch.rand(num_slots, columns, generator=gen) < 0.25 / columns] = -1  # a placeholder in some rows
    prompt_len = torch.tensor([rng.choice([0, 1, rng.randrange(columns), columns - 1]) for _ in range(num_slots)],
                              dtype=torch.int32)
    slot_of_row: list[int] = []
    pos: list[int] = []
    local: list[int] = []
    input_ids: list[int] = []
    for slot in rng.sample(range(num_slots), requests):
        base = rng.randrange(max(1, columns - drafts))
        for k in range(drafts + 1):
            slot_of_row.append(slot)
            pos.append(base + k)
            local.append(k)
            draft = rng.choice([-1, rng.randrange(vocab), rng.randrange(vocab), rng.randrange(vocab)])
            input_ids.append(int(tokens[slot, base]) if k == 0 else draft)
    slot_of_row.append(num_slots)  # the sentinel: the tables' last slot, clamped into the matrix
    pos.append(rng.randrange(columns))
    local.append(0)
    input_ids.append(0)
    n = len(pos)
    widths = torch.full((num_slots + 1,), wide) if every else torch.randint(1, wide + 1, (num_slots + 1,), generator=gen)
    widths[-1] = 0  # the sentinel slot's padding
    params = torch.cat([torch.randint(0, 2**32, (num_slots + 1, 2), generator=gen), widths[:, None],
                        torch.randint(0, 4, (num_slots + 1, 1), generator=gen).clamp(max=1)], dim=1)
    member = torch.rand(n, generator=gen) < 0.85
    member[-1] = False
    has = drafts > 0
    return (tokens, prompt_len, torch.tensor(pos, dtype=torch.int32),
            torch.tensor(input_ids, dtype=torch.int32) if has else None,
            torch.tensor(local, dtype=torch.int32) if has else None, torch.tensor(slot_of_row), member, params, wide,
            every, max_history)


def history_edge_case(max_history: int, wide: int) -> tuple[Any, ...]:
    """Four rows whose context repeats once: the window ending exactly ``max_history`` positions
    back (skips), one further (draws), at the output's first whole context (skips), and half in the
    prompt (draws); distinct tokens elsewhere, every width ``wide``, no drafts."""
    far, near = max_history + 2 * wide + 4, 2 * wide + 3  # near: the output's first context inside the history
    pos = torch.tensor([far, far, near, near], dtype=torch.int32)
    tokens = torch.arange(4 * (far + wide), dtype=torch.int32).view(4, far + wide) + 1000
    prompt_len = torch.tensor([0, 0, 2, 2], dtype=torch.int32)
    for row, end in enumerate([far - max_history, far - max_history - 1, 2 + wide - 1, 2 + wide - 2]):
        p = int(pos[row])
        tokens[row, end - wide + 1 : end + 1] = tokens[row, p - wide + 1 : p + 1]
    params = torch.tensor([[7, 9, wide, 1]] * 5)
    return (tokens, prompt_len, pos, None, None, torch.arange(4), torch.ones(4, dtype=torch.bool), params, wide, True,
            max_history)


def window_cases() -> list[tuple[Any, ...]]:
    """The window cases the tests and the checks run: widths 1..9 (mixed or not), drafts or none,
    spans cut by the history (``max_history`` below the matrix) or by the matrix, spans of one
    block of the kernel's scan and of several."""
    cases = []
    for seed, (wide, every, drafts, history, columns) in enumerate(
            [(4, True, 0, 12, 48), (4, True, 2, 12, 48), (6, False, 0, 20, 40), (6, False, 3, 9, 64),
             (1, True, 0, 5, 30), (9, False, 1, 100, 50), (3, False, 2, 7, 33), (5, True, 0, 40, 20),
             (4, True, 2, 300, 700), (7, False, 0, 8192, 600)]):
        cases.append(window_case(seed, requests=6, columns=columns, wide=wide, every=every, drafts=drafts,
                                 max_history=history, small=seed not in (3, 9)))
    return [*cases, history_edge_case(12, 4), history_edge_case(300, 1)]


def _on(args: tuple[Any, ...], device: torch.device) -> tuple[Any, ...]:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def compare_decisions(device: torch.device, compiled: Callable[..., torch.Tensor], *, batches: Sequence[int],
                      span: int) -> list[dict[str, Any]]:
    """Rows where the compiled window decisions differ from the eager ones on ``device`` and the CPU's."""
    out = []
    for wide, every in ((4, True), (6, False)):
        for batch in batches:
            host = window_inputs(batch, wide, every, 100 + batch + wide, span)
            dev = _on(host, device)
            got = compiled(*dev).cpu()
            eager = window_decisions(*dev).cpu()
            cpu = window_decisions(*host)
            out.append({"batch": batch, "wide": wide, "every": every, "draws": int(cpu[:, 4].sum()),
                        "vs_eager": int((got != eager).any(1).sum()), "vs_cpu": int((got != cpu).any(1).sum())})
    return out


def listed_inputs(n: int, vocab: int, seed: int) -> tuple[Any, ...]:
    """Random ``listed_draw`` arguments on the CPU (the V1 runner's step): ``n`` rows of logits with
    masked entries, all firing in a shuffled order, their slots, tables and PRF states."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * 4
    logits[torch.rand(n, vocab, generator=gen) < 0.3] = -torch.inf
    rows_dev = torch.randperm(n, generator=gen)
    slots = torch.randperm(max(n, 16), generator=gen)[:n]
    temperature_table = torch.rand(max(n, 16) + 1, 1, generator=gen) * 1.9 + 0.05
    params_table = torch.cat([torch.randint(0, 2**32, (max(n, 16) + 1, 2), generator=gen),
                              torch.full((max(n, 16) + 1, 1), 4), torch.ones(max(n, 16) + 1, 1, dtype=torch.long)], dim=1)
    states = torch.randint(0, 2**32, (4, n), generator=gen).T  # a transposed view, as the upload's
    return logits, logits.view(-1), rows_dev, slots, temperature_table, params_table, states, vocab


def compare_listed(device: torch.device, compiled: Callable[..., Any], *, vocab: int,
                   batches: Sequence[int]) -> list[dict[str, Any]]:
    """Rows where the compiled V1 draw (``listed_draw``: index and value) differs from the eager
    one on ``device`` and the CPU's."""
    out = []
    for batch in batches:
        host = listed_inputs(batch, vocab, 200 + batch)
        dev = _on(host, device)
        dev = (dev[0], dev[0].view(-1), *dev[2:])  # the flat view of the device's own logits
        got = [t.cpu() for t in compiled(*dev)]
        eager = [t.cpu() for t in listed_draw(*dev)]
        cpu = listed_draw(*host)

        def differing(a: list[torch.Tensor], b: Sequence[torch.Tensor]) -> int:
            return int(((a[0] != b[0]) | (a[1].view(torch.int32) != b[1].view(torch.int32))).sum())

        out.append({"batch": batch, "vs_eager": differing(got, eager), "vs_cpu": differing(got, cpu)})
    return out


def _compile(device: torch.device, vocab: int) -> tuple[Callable[..., torch.Tensor] | None, float, str]:
    """The compiled draw as ``draw`` gets it, its first run's wall time, and an error if none."""
    watermark_compiled.reset()
    fn = watermark_compiled.compiled_draw()
    if fn is None:
        return None, 0.0, "torch.compile refused (see the log line)"
    inputs = _to(make_inputs(4, vocab, torch.float32, 99)[0], device)
    t0 = time.perf_counter()
    try:
        fn(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # reported, as draw would fall back
        return None, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return fn, time.perf_counter() - t0, ""


def _line(ok: bool) -> str:
    return "ok" if ok else "FAILED"


def run(device: torch.device, *, vocab: int = 151936, steps: int = 200, batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """The watermark section on ``device`` (CUDA: every figure; CPU: compile and bits only)."""
    results: dict[str, Any] = {"options": watermark_compiled.compile_options()}
    fn, seconds, error = _compile(device, vocab)
    ok = fn is not None
    results["compile"] = {"seconds": seconds, "error": error}
    said = f"{seconds:.1f} s" if fn else error
    print(f"watermark compile: {said}; options {results['options']} -> {_line(ok)}", flush=True)
    if fn is None:
        return False, results
    dtypes = (torch.float32, torch.bfloat16)
    results["bits"] = compare(device, fn, vocab=vocab, batches=batches, dtypes=dtypes)
    for r in results["bits"]:
        good = r["vs_eager"] == 0 and r["vs_cpu"] == 0 and r["uniform_bits"] == 0
        ok &= good
        print(f"watermark bits batch {r['batch']} {r['dtype']} vocab {vocab}: compiled vs eager {r['vs_eager']} rows, "
              f"vs CPU {r['vs_cpu']} rows (eager vs CPU {r['eager_vs_cpu']}); uniforms vs CPU {r['uniform_bits']} "
              f"differing -> {_line(good)}", flush=True)
    diffs = _absorb_diffs(device)
    results["absorb_diffs"] = diffs
    ok &= diffs == 0
    print(f"watermark absorb on {device.type} vs host context_state: {diffs} of 256 rows differing -> {_line(diffs == 0)}",
          flush=True)
    listed = watermark_compiled.LISTED.get()
    if listed is None:
        print("watermark V1 draw: not compiled -> FAILED", flush=True)
        return False, results
    results["listed"] = compare_listed(device, listed, vocab=vocab, batches=batches)
    for r in results["listed"]:
        good = r["vs_eager"] == 0 and r["vs_cpu"] == 0
        ok &= good
        print(f"watermark V1 draw (gathers, draw, kept value) batch {r['batch']} vocab {vocab}: compiled vs eager "
              f"{r['vs_eager']} rows, vs CPU {r['vs_cpu']} rows -> {_line(good)}", flush=True)
    decide = watermark_compiled.DECIDE.get()
    span = MAX_HISTORY + 4 if device.type == "cuda" else 64
    if decide is None:
        ok = False
        print("watermark window decisions: not compiled -> FAILED", flush=True)
        return ok, results
    results["decisions"] = compare_decisions(device, decide, batches=batches, span=span)
    for r in results["decisions"]:
        good = r["vs_eager"] == 0 and r["vs_cpu"] == 0
        ok &= good
        print(f"watermark window decisions batch {r['batch']} width {r['wide']}{'' if r['every'] else ' (mixed)'} span "
              f"{span}: compiled vs eager {r['vs_eager']} rows, vs CPU {r['vs_cpu']} rows ({r['draws']} drawing) "
              f"-> {_line(good)}", flush=True)
    if device.type != "cuda":
        return ok, results
    results["kernels"], results["time"] = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            inputs = _to(make_inputs(batch, vocab, torch.float32, 7 + batch)[0], device)
            for _ in range(3):
                fn(*inputs)
            compiled_ops, names = device_ops(lambda: fn(*inputs), 10, Path(tmp))  # noqa: B023  # called at once
            eager_ops, _ = device_ops(lambda: batched_draw(*inputs), 10, Path(tmp))  # noqa: B023  # called at once
            good = compiled_ops <= KERNEL_BUDGET
            ok &= good
            results["kernels"].append({"batch": batch, "compiled": compiled_ops, "eager": eager_ops, "names": names})
            print(f"watermark kernels batch {batch}: compiled draw {compiled_ops:.1f} device ops (eager {eager_ops:.1f}; "
                  f"budget {KERNEL_BUDGET}): {names} -> {_line(good)}", flush=True)
            torch.cuda.synchronize()
            c_wall, c_dev = timed(lambda: fn(*inputs), steps)  # noqa: B023  # called at once
            e_wall, e_dev = timed(lambda: batched_draw(*inputs), steps)  # noqa: B023  # called at once
            results["time"].append({"batch": batch, "compiled_wall_ms": c_wall, "compiled_device_ms": c_dev,
                                    "eager_wall_ms": e_wall, "eager_device_ms": e_dev})
            print(f"watermark time batch {batch}: compiled {c_wall:.4f} ms wall, {c_dev:.4f} ms device; eager "
                  f"{e_wall:.4f} ms wall, {e_dev:.4f} ms device ({e_dev / max(c_dev, 1e-9):.1f}x)", flush=True)
            window = _on(window_inputs(batch, 4, True, 5 + batch, span), device)
            for _ in range(3):
                decide(*window)
            listed_args = _on(listed_inputs(batch, vocab, 300 + batch), device)
            listed_args = (listed_args[0], listed_args[0].view(-1), *listed_args[2:])
            for _ in range(3):
                listed(*listed_args)
            torch.cuda.synchronize()
            synced = sync_error(lambda: fn(*inputs), lambda: listed(*listed_args),  # noqa: B023  # called at once
                                lambda: decide(*window))  # noqa: B023  # called at once
            ok &= not synced
            results.setdefault("sync", []).append({"batch": batch, "error": synced})
            print(f"watermark sync batch {batch} (draw, V1 draw, window decisions): {synced or 'none'} -> "
                  f"{_line(not synced)}", flush=True)
            l_ops, l_names = device_ops(lambda: listed(*listed_args), 10, Path(tmp))  # noqa: B023  # called at once
            results["kernels"].append({"batch": batch, "v1_draw_compiled": l_ops, "names": l_names})
            print(f"watermark V1 draw kernels batch {batch}: compiled {l_ops:.1f} device ops (the step adds its upload, "
                  f"row fill and index copy; the cost table has the whole step): {l_names}", flush=True)
            d_ops, d_names = device_ops(lambda: decide(*window), 10, Path(tmp))  # noqa: B023  # called at once
            de_ops, _ = device_ops(lambda: window_decisions(*window), 10, Path(tmp))  # noqa: B023  # called at once
            d_wall, d_dev = timed(lambda: decide(*window), steps)  # noqa: B023  # called at once
            de_wall, de_dev = timed(lambda: window_decisions(*window), steps)  # noqa: B023  # called at once
            results["kernels"].append({"batch": batch, "decisions_compiled": d_ops, "decisions_eager": de_ops,
                                       "names": d_names})
            results["time"].append({"batch": batch, "decisions_compiled_device_ms": d_dev, "decisions_eager_device_ms": de_dev})
            print(f"watermark window decisions batch {batch} span {span}: compiled {d_ops:.1f} device ops (eager "
                  f"{de_ops:.1f}): {d_names}; {d_wall:.4f} ms wall, {d_dev:.4f} ms device; eager {de_wall:.4f} ms wall, "
                  f"{de_dev:.4f} ms device", flush=True)
    return ok, results


def fused_inputs(n: int, vocab: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A fused draw's inputs: logits (ties, ``-inf``), rows, slots, temperature and params tables,
    states, which rows fire; then keys, contexts and widths for the absorb."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + 1, vocab, generator=g) * 3
    logits[0, :] = 0.5
    logits[-1, :: 5] = float("-inf")
    rows = torch.randperm(n + 1, generator=g)[:n]
    slots = torch.randperm(n + 2, generator=g)[:n]
    temperature = torch.rand(n + 2, 1, generator=g) * 1.5 + 0.05
    params = torch.randint(0, 2**32, (n + 2, 4), generator=g, dtype=torch.int64)
    states = torch.randint(0, 2**32, (n, 4), generator=g, dtype=torch.int64)
    fire = torch.randint(0, 2, (n,), generator=g)
    contexts = torch.randint(-1, 2**31 - 1, (n, 9), generator=g)
    widths = torch.randint(0, 10, (n,), generator=g)
    return tuple(t.to(device) for t in (logits, rows, slots, temperature, params, states, fire, contexts, widths))


def fused_bits(device: torch.device, vocab: int, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch: the Triton kernels against the eager reference on ``device`` (rows differing: 0)."""
    from dynlogits.kernels import watermark as kernels

    out = []
    for batch in batches:
        logits, rows, slots, temperature, params, states, fire, contexts, widths = fused_inputs(batch, vocab, batch, device)
        diffs = 0
        for f in (None, fire):
            a, b = logits.clone(), logits.clone()
            ta = kernels.draw(a, rows, slots, temperature, params, states, f, True)
            tb = watermark_compiled.fused_draw_force_.eager(b, rows, slots, temperature, params, states, f)
            diffs += int((ta != tb).sum()) + int((torch.nan_to_num(a) != torch.nan_to_num(b)).any(1).sum())
        for w in (None, widths):
            diffs += int((kernels.absorb(params[:batch, :2], contexts, w) != absorb(params[:batch, :2], contexts, w)).any(1).sum())
        out.append({"batch": batch, "vocab": vocab, "rows_differing": diffs})
        print(f"watermark fused bits batch {batch} vocab {vocab}: {diffs} rows differ -> {_line(diffs == 0)}", flush=True)
    window = window_bits(device)
    out.append(window)
    print(f"watermark fused window bits ({window['cases']} cases, {window['rows']} rows): {window['rows_differing']} rows "
          f"differ -> {_line(window['rows_differing'] == 0)}", flush=True)
    return out


def window_bits(device: torch.device, batches: Sequence[int] = (1, 64)) -> dict[str, Any]:
    """The window kernel (``kernels.window_state``) against the op's eager reference on ``device``:
    ``window_cases``, then per batch a runner-sized case (``MAX_HISTORY``, a matrix wider than the
    span, drafts and none); rows differing (must be 0)."""
    from dynlogits.kernels import watermark as kernels

    cases = [*window_cases()]
    for batch in batches:
        for drafts in (0, 2):
            cases.append(window_case(batch + drafts, requests=max(1, batch // (drafts + 1)), columns=MAX_HISTORY + 300,
                                     wide=4, every=True, drafts=drafts, max_history=MAX_HISTORY, small=False))
    rows = diffs = 0
    for case in cases:
        on = _on(case, device)
        got = kernels.window_state(*on)
        want = watermark_compiled.fused_window_state.eager(*on)
        diffs += int((got != want).any(1).sum())
        rows += len(want)
    return {"batch": "window", "cases": len(cases), "rows": rows, "rows_differing": diffs}


def run_fused(device: torch.device, *, vocab: int = 151936, steps: int = 200,
              batches: Sequence[int] = BATCHES) -> tuple[bool, dict[str, Any]]:
    """The fused kernels on a CUDA ``device``: bits, device ops, no sync, time (the module doc)."""
    from dynlogits.kernels import watermark as kernels

    results: dict[str, Any] = {"bits": fused_bits(device, vocab, batches), "kernels": [], "sync": [], "time": []}
    ok = all(r["rows_differing"] == 0 for r in results["bits"])
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            logits, rows, slots, temperature, params, states, fire, contexts, widths = fused_inputs(batch, vocab, 7, device)
            def step() -> None:
                kernels.draw(logits, rows, slots, temperature, params, states, fire, True)  # noqa: B023  # called at once
            def absorb_step() -> None:
                kernels.absorb(params[:batch, :2], contexts, widths)  # noqa: B023  # called at once
            window = _on(window_case(batch, requests=batch, columns=MAX_HISTORY + 300, wide=4, every=True, drafts=0,
                                     max_history=MAX_HISTORY, small=False), device)
            def window_step() -> None:
                kernels.window_state(*window)  # noqa: B023  # called at once
            step()
            absorb_step()
            window_step()
            d_ops, d_names = device_ops(step, 10, Path(tmp))
            a_ops, a_names = device_ops(absorb_step, 10, Path(tmp))
            w_ops, w_names = device_ops(window_step, 10, Path(tmp))
            fits = d_ops <= 2 and a_ops <= 1 and w_ops <= 1  # torch.empty allocates without a kernel
            ok &= fits
            results["kernels"].append({"batch": batch, "draw": d_ops, "absorb": a_ops, "window": w_ops,
                                       "names": d_names + a_names + w_names})
            print(f"watermark fused kernels batch {batch}: draw {d_ops:.1f}, absorb {a_ops:.1f}, window {w_ops:.1f} "
                  f"device ops {d_names + a_names + w_names} -> {_line(fits)}", flush=True)
            synced = sync_error(step, absorb_step, window_step)
            ok &= not synced
            results["sync"].append({"batch": batch, "error": synced})
            print(f"watermark fused sync batch {batch}: {synced or 'none'} -> {_line(not synced)}", flush=True)
            wall, dev = timed(step, steps)
            w_wall, w_dev = timed(window_step, steps)
            results["time"].append({"batch": batch, "draw_wall_ms": wall, "draw_device_ms": dev,
                                    "window_wall_ms": w_wall, "window_device_ms": w_dev})
            print(f"watermark fused time batch {batch}: draw and force {wall:.4f} ms wall, {dev:.4f} ms device; "
                  f"window decisions (span {MAX_HISTORY + 4}) {w_wall:.4f} ms wall, {w_dev:.4f} ms device", flush=True)
    return ok, results


def interpreted_check(vocab: int = 1003, batches: Sequence[int] = (1, 5, 64)) -> bool:
    """``fused_bits`` on the CPU in Triton's interpreter, in a subprocess (``TRITON_INTERPRET=1``
    must be set before Triton is imported)."""
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "dynlogits.testing.cuda.watermark_check", "--interpreted-child",
                           "--vocab", str(vocab), "--batches", ",".join(map(str, batches))], env=env, check=False)
    return done.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.watermark_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU self test (small vocab, no device figures)")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--interpreted-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batches", default="1,5,64", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.interpreted_child:  # in the interpreter (the parent set TRITON_INTERPRET=1)
        bits = fused_bits(torch.device("cpu"), args.vocab or 1003, [int(b) for b in args.batches.split(",")])
        return 0 if all(r["rows_differing"] == 0 for r in bits) else 1
    os.environ[watermark_compiled.ENV] = "1"  # the compiled functions are opt-in: this check is what they wait on
    if args.cpu:
        ok, _ = run(torch.device("cpu"), vocab=args.vocab or 1003, steps=args.steps, batches=(1, 5, 64))
        ok &= interpreted_check(args.vocab or 1003)
    elif not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__}); --cpu runs the CPU self test", file=sys.stderr)
        return 2
    else:
        ok, _ = run(torch.device("cuda"), vocab=args.vocab or 151936, steps=args.steps)
        fused_ok, _ = run_fused(torch.device("cuda"), vocab=args.vocab or 151936, steps=args.steps)
        ok &= fused_ok
    print("\nresult:", _line(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
