"""``dry``'s fused Model Runner V2 step (``dry_device.fused_lower_``) on the CPU: ``lower_window_``
(numpy, only the positions holding a row's last token measured) equals the dense reference
(``dense_lower_``: ``device_penalties`` then ``lower_rows``) bit for bit over random windows (breakers,
placeholders, look-backs, prompts counted or not, caps, drafts, non-member and sentinel rows, logits
dtypes and a row stride wider than the vocabulary), and equals the hosted processor over long
repetitive histories whose repeats run past the cap; the kind's gate falls back to the reference
with one warning when its probe fails. Every equality holds on both of ``lower_window_``'s paths: the
compiled window step (``dry_native``'s ``dry_window``, steps without drafts) and numpy."""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from dynlogits.processors import dry_device, dry_native
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.dry import factory
from dynlogits.processors.dry_device import dense_lower_, lower_window_, probe_case, probe_floor
from dynlogits.processors.dry_group import DryGroup
from dynlogits.processors.vocabulary import Vocabulary
from dynlogits.specs.builtin.dry import DrySpec


@pytest.fixture(autouse=True, params=["native", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Each test on the compiled window step (where this machine builds it) and on numpy; yields the
    count of steps the compiled one took."""
    taken = [0]
    if request.param == "numpy":
        monkeypatch.setattr(dry_device, "_native_lowered", lambda *args: False)
    else:
        if shutil.which("cc") is None:
            pytest.skip("no C compiler (cc) on this machine")
        assert dry_native.window_step(wait=True) is not None, "the native window step did not build with this machine's cc"
        native = dry_device._native_lowered

        def counted(*args: Any) -> bool:
            done = native(*args)
            taken[0] += done
            return done

        monkeypatch.setattr(dry_device, "_native_lowered", counted)
    yield taken


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_cpu_step_equals_the_dense_reference_bit_for_bit(dtype: torch.dtype) -> None:
    lowered = 0
    for seed in range(120):
        rng = random.Random(seed)
        args, _, _ = probe_case(seed, rows=rng.randint(1, 20), drafts=seed % 2 == 0)
        width = rng.randint(2, 80)
        cap = rng.randint(1, width)
        logits = args[0].to(dtype)
        if seed % 3 == 0:  # a row stride wider than the vocabulary (a view of a wider buffer)
            logits = torch.cat((logits, torch.zeros(len(logits), 5, dtype=dtype)), 1)[:, :-5]
        got, want = logits.clone(), logits.clone()
        lower_window_(got, *args[1:], width, cap)
        dense_lower_(want, *args[1:], width, cap)
        assert _same(got, want), (seed, width, cap)
        lowered += int((want.nan_to_num() != logits.nan_to_num()).sum())
    assert lowered > 300  # the premise: rows were lowered


VOCAB = ("a", "b", "c", ":", "<", "br>", "y", "<br>", "d", "e", "f", "g", "h", "i", "j", "k")


def test_long_repeats_equal_the_hosted_processor() -> None:
    """A 7-token cycle repeated for hundreds of tokens (repeats past the cap), rewritten here and
    in its first third, with breakers (``:``), placeholders, look-backs and prompts counted or not: every row of
    ``lower_window_`` equals the hosted processor on the history it sees."""
    rng = random.Random(3)
    slots, rows, max_len = 6, 6, 420
    group = DryGroup(0, slots + 1, torch.device("cpu"))
    group.from_window = True
    tokens = torch.zeros(slots, max_len, dtype=torch.int32)
    prompt_len = torch.zeros(slots, dtype=torch.int32)
    processors, histories = [], []
    for slot in range(slots):
        entry = {"kind": "dry", "multiplier": rng.choice([0.8, 2.0]), "base": rng.choice([1.5, 1.75, 3.0]),
                 "allowed_length": rng.randint(1, 4), "penalty_last_n": rng.choice([-1, 64, 300]),
                 "sequence_breakers": rng.choice([[], [":"]]), "include_prompt": rng.random() < 0.6}
        prompt = [rng.randrange(16) for _ in range(rng.randint(1, 30))]
        cycle = [rng.choice([0, 1, 2, 4, 5, 8, 9, 10, 11]) for _ in range(7)]
        output = (cycle * 60)[: rng.randint(200, max_len - len(prompt))]
        for _ in range(3):  # a few rewrites, a breaker, a placeholder, in the first third: the last repeat runs long
            output[rng.randrange(len(output) // 3)] = rng.choice([3, 3, -1, 12])
        processor = factory(DrySpec.model_validate(entry), RealizeContext(
            len(VOCAB), prompt_ids=tuple(prompt), tokenizer_vocabulary=Vocabulary(lambda: VOCAB)))
        assert DryGroup.fits_window(processor.template, group)
        group.assign(slot, processor.template)
        seq = [*prompt, *output]
        tokens[slot, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
        prompt_len[slot] = len(prompt)
        processors.append(processor)
        histories.append(output)
    width = max(min(max(p.template.lookback for p in processors), max_len), 2)
    cap = max(min(max(p.template.cap for p in processors), width), 1)
    pos = torch.tensor([int(prompt_len[s]) + len(histories[s]) - 1 for s in range(rows)], dtype=torch.int32)
    logits = torch.randn(rows, len(VOCAB)) * 3
    got = logits.clone()
    lower_window_(got, tokens, prompt_len, pos, None, None, torch.arange(rows), torch.ones(rows, dtype=torch.bool),
                  group.params.dev, group.singles.dev, group.amounts.dev, width, cap)
    for row in range(rows):
        want = logits[row].clone()
        processors[row](histories[row], want)
        assert torch.equal(got[row], want), row
    assert int((got != logits).any(1).sum()) >= 4  # the premise: rows were lowered
    assert cap > 100  # repeats measured far back


def test_long_cycles_with_breakers_floors_and_wide_positions_equal_the_dense_reference(path: list[int]) -> None:
    """Windows of hundreds of tokens repeating short cycles (repeats up to the cap, the Z-function's
    boxes reused), breakers in the cycles or not, placeholders, floors, int64 positions (vLLM's
    ``ctx.pos``): bit for bit the dense reference; on the native path every step compiled."""
    lowered = steps = 0
    for seed in range(24):
        rng = random.Random(seed)
        args, _, _ = probe_case(seed, rows=rng.randint(1, 12), max_len=rng.choice([300, 600]), drafts=False)
        logits, tokens, prompt_len, pos = args[0], args[1].clone(), args[2], args[3].clone()
        for slot in range(tokens.shape[0]):
            cycle = torch.randint(0, 6, (rng.randint(1, 9),), dtype=torch.int32)
            start = rng.randrange(tokens.shape[1] // 2)
            reps = -(-(tokens.shape[1] - start) // len(cycle))
            tokens[slot, start:] = cycle.repeat(reps)[: tokens.shape[1] - start]
            if rng.random() < 0.5:  # a placeholder or a rewrite breaks one repeat
                tokens[slot, rng.randrange(start, tokens.shape[1])] = rng.choice([-1, 6])
        pos[:] = torch.randint(tokens.shape[1] // 2, tokens.shape[1], pos.shape)
        floor = probe_floor(seed, args) if seed % 3 == 0 else None
        width = rng.choice([tokens.shape[1], rng.randint(2, tokens.shape[1])])
        cap = min(width, rng.choice([256, rng.randint(1, 64)]))
        step = (logits, tokens, prompt_len, pos.long() if seed % 2 else pos, *args[4:])
        got, want = logits.clone(), logits.clone()
        lower_window_(got, *step[1:], width, cap, floor)
        dense_lower_(want, *step[1:], width, cap, floor)
        assert _same(got, want), (seed, width, cap)
        lowered += int((want.nan_to_num() != logits.nan_to_num()).sum())
        steps += bool(args[7].any())  # a step with a member row
    assert lowered > 50  # the premise: rows were lowered
    assert path[0] in (0, steps)  # numpy: never; native: every step with a member row


def test_the_gate_falls_back_with_one_warning_when_the_probe_fails(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    calls: list[torch.device] = []

    def failing(device: torch.device) -> bool:
        calls.append(device)
        return False

    monkeypatch.setattr(dry_device, "_probe", failing)
    dry_device.reset_fused()
    try:
        with caplog.at_level(logging.WARNING, logger="dynlogits.kernels"):
            assert not dry_device.fused_ready(torch.device("cuda", 0))
            assert not dry_device.fused_ready(torch.device("cuda", 0))
        assert len(calls) == 1
        assert sum("dry" in r.getMessage() for r in caplog.records) == 1
        assert not dry_device.fused_ready(torch.device("cpu"))  # the CPU calls ``lower_window_`` itself
        assert dry_device.fused_ready(torch.device("meta"))  # the CUDA model counts the declared launches
    finally:
        dry_device.reset_fused()
