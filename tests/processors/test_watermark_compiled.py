"""``watermark_compiled``: the pure draw is the eager draw bit for bit, the dispatch draws eagerly
off CUDA (nothing compiled), a compile or run failure falls back to eager with one log line, and
the pure function compiles in one graph (Inductor's CPU backend) with no host read."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import pytest
import torch

from dynlogits.processors import watermark_compiled
from dynlogits.processors.watermark_compiled import (
    _pure_listed_draw,
    _pure_window_decisions,
    compile_options,
    decide,
    draw,
    listed_draw,
    pure_draw,
    window_decisions,
)
from dynlogits.processors.watermark_prf import context_state, key_words
from dynlogits.processors.watermark_resident import batched_draw

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _inputs(batch: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32) -> Inputs:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(batch, vocab, generator=gen) * rng.choice([1.0, 8.0])
    if batch > 1:
        rows[0, torch.rand(vocab, generator=gen) < 0.7] = -torch.inf
        rows[-1, : vocab // 2] = -torch.inf
    temperatures = torch.tensor([rng.uniform(0.05, 2.0) for _ in range(batch)], dtype=torch.float32)
    keys = [rng.getrandbits(64) for _ in range(batch)]
    contexts = [[rng.choice([-1, rng.randrange(vocab)]) for _ in range(rng.randint(1, 9))] for _ in range(batch)]
    states = torch.tensor([context_state(k, c) for k, c in zip(keys, contexts)], dtype=torch.int64)
    words = torch.tensor([key_words(k) for k in keys], dtype=torch.int64)
    return rows.to(dtype), temperatures, states, words


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    watermark_compiled.reset()
    yield
    watermark_compiled.reset()


@pytest.mark.parametrize(("batch", "vocab", "dtype"), [(1, 1000, torch.float32), (7, 1001, torch.float32),
                                                      (5, 4099, torch.bfloat16), (3, 151936, torch.float32)])
def test_the_pure_draw_is_the_eager_draw_bit_for_bit(batch: int, vocab: int, dtype: torch.dtype) -> None:
    inputs = _inputs(batch, vocab, batch * vocab, dtype)
    assert torch.equal(pure_draw(*inputs), batched_draw(*inputs))


def test_the_uniforms_reciprocal_rounds_as_the_division_for_every_mantissa() -> None:
    """Inductor on CUDA turns ``/ (2**24 + 1)`` into ``* (1 / (2**24 + 1))``: the same float32 for all."""
    m = np.arange(2**24, dtype=np.float64) + 1.0
    divided = (m / (2**24 + 1)).astype(np.float32)
    multiplied = (m * (1.0 / (2**24 + 1))).astype(np.float32)
    assert np.array_equal(divided.view(np.int32), multiplied.view(np.int32))


def test_on_the_cpu_the_draw_is_eager_and_nothing_is_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled on the CPU path")

    monkeypatch.setattr(torch, "compile", refuse)
    inputs = _inputs(4, 1003, 1)
    seen: list[int] = []

    def eager(*args: torch.Tensor) -> torch.Tensor:
        seen.append(1)
        return batched_draw(*args)

    assert torch.equal(draw(*inputs, eager), batched_draw(*inputs)) and seen == [1]
    assert watermark_compiled.DRAW.compiled is None


@pytest.mark.parametrize("fails", ["compile", "run"])
def test_a_failing_compile_falls_back_to_eager_with_one_log_line(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture, fails: str) -> None:
    calls: list[str] = []

    def broken(*args: torch.Tensor) -> torch.Tensor:
        calls.append("run")
        raise RuntimeError("no Triton\nmore")

    def fake_compile(fn: object, **kwargs: object) -> object:
        calls.append("compile")
        assert kwargs["fullgraph"] is True and kwargs["dynamic"] is True
        if fails == "compile":
            raise RuntimeError("no Triton\nmore")
        return broken

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setenv(watermark_compiled.ENV, "1")
    monkeypatch.setattr(watermark_compiled, "_wants_compiled", lambda rows: True)  # as if on CUDA
    inputs = _inputs(3, 1003, 2)
    with caplog.at_level(logging.WARNING, logger=watermark_compiled.__name__):
        for _ in range(3):
            assert torch.equal(draw(*inputs, batched_draw), batched_draw(*inputs))
    assert calls == (["compile"] if fails == "compile" else ["compile", "run"])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "(RuntimeError: no Triton)" in lines[0], lines


@pytest.mark.parametrize("value", [None, "0", "true"])
def test_eager_unless_the_environment_turns_it_on(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(watermark_compiled.ENV, raising=False)
    else:
        monkeypatch.setenv(watermark_compiled.ENV, value)
    monkeypatch.setattr(watermark_compiled, "_wants_compiled", lambda rows: True)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    inputs = _inputs(2, 1003, 3)
    assert torch.equal(draw(*inputs, batched_draw), batched_draw(*inputs))


def test_the_pure_draw_reads_nothing_back_on_the_cuda_model() -> None:
    from dynlogits.testing.cuda.simcuda import SimCuda

    inputs = _inputs(4, 1003, 4)
    with SimCuda() as sim:
        rows, temperatures, states, keys = (sim.put(t) for t in inputs)
        got = pure_draw(rows, temperatures, states, keys)
    assert [str(s) for s in sim.syncs] == []
    assert torch.equal(sim.value(got), batched_draw(*inputs))


def test_the_pure_draw_compiles_in_one_graph_to_the_same_bits() -> None:
    """``fullgraph=True`` refuses a graph break (an ``.item()``, a host read, a data-dependent
    branch); Inductor's CPU backend, the options the CUDA path asks for (about 10 s here)."""
    pytest.importorskip("torch._inductor")
    fn = torch.compile(pure_draw, fullgraph=True, dynamic=True, options=compile_options())
    for batch, vocab, seed in [(6, 1003, 5), (9, 2050, 6)]:
        inputs = _inputs(batch, vocab, seed)
        assert torch.equal(fn(*inputs), batched_draw(*inputs))


def _window(n: int, wide: int, every: bool, seed: int, span: int = 40) -> tuple[Any, ...]:
    """Random ``window_decisions`` inputs: tokens of a small vocabulary (repeats are common),
    placeholders, rows whose output starts inside the span or before it, mixed widths."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 3 if wide >= 4 else 12, (n, span), generator=gen)
    tokens[torch.rand(n, span, generator=gen) < 0.02] = -1
    pos = torch.randint(span - 5, span + 30, (n,), generator=gen)
    at = (pos - (span - 1))[:, None] + torch.arange(span)[None, :]
    prompt = torch.randint(0, span + 10, (n,), generator=gen)
    widths = torch.full((n,), wide) if every else torch.randint(1, wide + 1, (n,), generator=gen)
    keys = torch.randint(0, 2**32, (n, 2), generator=gen)
    params = torch.cat([keys, widths[:, None], torch.randint(0, 2, (n, 1), generator=gen)], dim=1)
    member = torch.rand(n, generator=gen) < 0.8
    return tokens, at, prompt, pos, params, member, torch.arange(wide)[None, :], wide, every, 12


@pytest.mark.parametrize(("wide", "every"), [(1, True), (4, True), (5, True), (6, False), (9, False)])
def test_the_pure_window_decisions_are_the_eager_ones(wide: int, every: bool) -> None:
    draws = 0
    for seed in range(5):
        args = _window(16, wide, every, seed)
        eager = window_decisions(*args)
        assert torch.equal(_pure_window_decisions(*args), eager)
        draws += int(eager[:, 4].sum())
    assert 0 < draws < 5 * 16 // 2  # some rows draw, most skip (not members, greedy, placeholders, repeats)


def test_on_the_cpu_the_window_decisions_are_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled on the CPU path"))
    args = _window(8, 4, False, 1)
    assert torch.equal(decide(*args), window_decisions(*args))
    assert watermark_compiled.DECIDE.compiled is None


def test_the_window_decisions_compile_in_one_graph_to_the_same_words() -> None:
    pytest.importorskip("torch._inductor")
    fn = torch.compile(_pure_window_decisions, fullgraph=True, dynamic=True, options=compile_options())
    for wide, every, seed in [(4, True, 7), (6, False, 8), (6, False, 9)]:
        args = _window(10 + seed, wide, every, seed, span=30 + seed)
        assert torch.equal(fn(*args), window_decisions(*args))


def _listed(seed: int, n: int = 5, rows: int = 9, vocab: int = 1003) -> tuple[Any, ...]:
    """Random ``listed_draw`` arguments: logits with masked entries, firing rows and their slots."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    logits[torch.rand(rows, vocab, generator=gen) < 0.5] = -torch.inf
    rows_dev = torch.randperm(rows, generator=gen)[:n]
    slots = torch.randperm(16, generator=gen)[:n]
    temperature_table = torch.rand(17, 1, generator=gen) + 0.05
    params_table = torch.cat([torch.randint(0, 2**32, (17, 2), generator=gen), torch.full((17, 1), 4),
                              torch.ones(17, 1, dtype=torch.long)], dim=1)
    states = torch.randint(0, 2**32, (4, n), generator=gen).T  # a transposed view, as the upload's
    return logits, logits.view(-1), rows_dev, slots, temperature_table, params_table, states, vocab


def test_the_pure_listed_draw_is_the_eager_one() -> None:
    for seed in range(4):
        args = _listed(seed)
        eager = listed_draw(*args)
        pure = _pure_listed_draw(*args)
        assert torch.equal(pure[0], eager[0]) and torch.equal(pure[1], eager[1])
        logits, rows_dev, vocab = args[0], args[2], args[7]
        assert torch.equal(eager[0] // vocab, rows_dev)
        assert torch.equal(torch.isneginf(eager[1]), torch.isneginf(logits.view(-1)[eager[0]]))


def test_the_listed_draw_compiles_in_one_graph_to_the_same_bits() -> None:
    pytest.importorskip("torch._inductor")
    fn = torch.compile(_pure_listed_draw, fullgraph=True, dynamic=True, options=compile_options())
    for seed, n in [(11, 5), (12, 3)]:
        args = _listed(seed, n=n)
        got, want = fn(*args), listed_draw(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# -- the fused window op (``fused_window_state``): its CPU implementation is the eager decisions --
def _decided_in_python(case: tuple[Any, ...]) -> tuple[list[int], dict[int, tuple[int, ...]], set[str]]:
    """Each row's decision from the window contract, one row at a time in Python (no tensor code):
    whether it draws, the state of each row whose width is in ``1..wide``, and which reasons to skip
    occurred (so a test can insist every one did)."""
    from dynlogits.kernels.watermark import window_span

    tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member, params, wide, every, history = case
    tokens_l, prompts, pos_l, slots_l = tokens.tolist(), prompt_len.tolist(), pos.tolist(), slot_of_row.tolist()
    inputs = None if input_ids is None else input_ids.tolist()
    local = None if local_pos is None else local_pos.tolist()
    span = window_span(tokens.shape[1], wide, history)
    draws: list[int] = []
    states: dict[int, tuple[int, ...]] = {}
    reasons: set[str] = set()
    for r, (raw, p) in enumerate(zip(slots_l, pos_l)):
        slot = min(raw, len(tokens_l) - 1)
        prompt = prompts[slot]
        k0, k1, width, samples = params[raw].tolist()
        width = wide if every else width

        def read(q: int, r: int = r, p: int = p, slot: int = slot) -> int:
            col = max(q, 0)
            back = p - col
            if inputs is not None and local is not None and back <= local[r]:
                return inputs[max(r - back, 0)]
            return tokens_l[slot][col]

        start = p - span + 1
        placeholder = any(read(q) < 0 for q in range(max(start, prompt), p + 1))
        compared = range(max(0, min(width, wide)))
        repeated = any(all(read(e - b) == read(p - b) for b in compared)
                       for e in range(max(start + wide - 1, prompt + width - 1, p - history), p))
        if 1 <= width <= wide:
            context = [read(q) if q >= prompt else -1 for q in range(p - width + 1, p + 1)]
            states[r] = context_state(k0 | k1 << 32, context)
        reasons |= {name for name, skips in (("member", not member[r]), ("greedy", not samples),
                                              ("placeholder", placeholder), ("repeat", repeated)) if skips}
        draws.append(int(bool(member[r]) and samples > 0 and not placeholder and not repeated))
    return draws, states, reasons


def test_the_window_op_on_the_cpu_is_the_window_contract_row_by_row() -> None:
    """Random windows (``watermark_check.window_cases``: repeats, short histories, placeholders,
    drafts, prompts ending anywhere, a sentinel row, mixed widths) through the op's CPU
    implementation against a row-by-row Python reading of the contract."""
    from dynlogits.testing.cuda.watermark_check import window_cases

    seen: set[str] = set()
    drawn = 0
    for case in window_cases():
        got = watermark_compiled.fused_window_state(*case)
        draws, states, reasons = _decided_in_python(case)
        assert got[:, 4].tolist() == draws
        assert all(tuple(got[r, :4].tolist()) == state for r, state in states.items())
        seen |= reasons
        drawn += sum(draws)
    assert seen == {"member", "greedy", "placeholder", "repeat"} and drawn > 20


def _group_decides(case: tuple[Any, ...], templates: dict[int, Any], device: torch.device, put: Any) -> torch.Tensor:
    """``WatermarkGroup.decide_from_window`` of ``case``'s window (``watermark_check.window_case``)
    with ``templates`` by slot, on ``device`` (``put`` moves a tensor there)."""
    from dynlogits.processors.watermark_resident import WatermarkGroup
    from dynlogits.processors.window import TokenWindow

    tokens, prompt_len, pos, input_ids, local_pos, slot_of_row = case[:6]
    group = WatermarkGroup(0, tokens.shape[0] + 1, device)
    for slot, template in templates.items():
        group.assign(slot, template)
    group.flush()
    window = TokenWindow(device).at(put(tokens), put(prompt_len), put(pos), None if input_ids is None else put(input_ids),
                                    None if local_pos is None else put(local_pos))
    return group.decide_from_window(group.every_row(put(slot_of_row)), window)


def test_the_resident_group_decides_the_same_with_the_fused_op_as_eagerly() -> None:
    """``WatermarkGroup.decide_from_window`` on the CPU (the eager path) and on the CUDA model (the
    fused op, one declared launch): the same decisions, no sync."""
    from dynlogits.processors.watermark_resident import MAX_HISTORY, WatermarkTemplate
    from dynlogits.testing.cuda.simcuda import SimCuda
    from dynlogits.testing.cuda.watermark_check import window_case

    drawn: list[int] = []
    rows = 0
    for seed, (drafts, widths) in enumerate([(0, (4,)), (2, (4,)), (0, (2, 5, 3)), (3, (1, 6))]):
        case = window_case(seed, requests=5, columns=MAX_HISTORY + 40 if seed == 0 else 60, wide=max(widths),
                           every=len(widths) == 1, drafts=drafts, max_history=MAX_HISTORY, small=seed != 0)
        slots = case[0].shape[0]
        rng = random.Random(seed)
        templates = {slot: WatermarkTemplate(rng.getrandbits(64), rng.choice(widths), rng.choice([None, 0.7, 1.0]))
                     for slot in sorted(set(case[5].tolist())) if slot < slots and rng.random() < 0.9}
        eager = _group_decides(case, templates, torch.device("cpu"), lambda t: t)
        with SimCuda() as sim:
            fused = _group_decides(case, templates, sim.device, sim.put)
        assert not sim.syncs and sim.ops.count("watermark_window_state") == 1
        assert torch.equal(sim.value(fused), eager), seed
        drawn.append(int(eager[:, 4].sum()))
        rows += len(eager)
    assert 0 < sum(drawn) < rows, drawn
