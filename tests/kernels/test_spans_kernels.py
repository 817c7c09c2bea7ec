"""``dynlogits::spans_advance_`` (``dynlogits.kernels.spans``): its eager reference equals today's
path of ``DeviceThinking.step`` (one window read and one ``SpanTables.advance`` a round) bit for
bit, and its Triton kernel, in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in a
subprocess before Triton is imported), equals the reference bit for bit: random 1-3 token
delimiters (closing or not, prompts opening spans, thresholds in the prompt's tail), several rounds
(a resumed request's catch-up: rounds past a short row's start), int32 and int64 token matrices,
a ``scale`` counting ``OUT`` from the transition."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dynlogits.kernels.fused import declared_launches
from dynlogits.kernels.spans import spans_advance_
from dynlogits.processors.device_thinking import CLOSED, STATE, DeviceThinking, SpanTables

CASES = textwrap.dedent('''
    import torch
    from dynlogits.processors.device_thinking import CLOSED, SpanTables

    class Tables(SpanTables):
        def __init__(self, n, device, closes, scale):
            self.closes, self.scale = closes, scale
            super().__init__(n, device)
        def delimiters(self, t):
            return t["start"], t["end"]
        def initial(self, t):
            return t["initial"]
        def outs(self, t):
            return t["outs"]

    def case(seed, n=11, max_len=24, vocab=4):
        """A table of ``n`` random members at their states after the prompt, a token matrix, total
        lengths and rounds (1 to 5: with a short ``max_len``, catch-up rounds reaching before a row's
        start, clamped)."""
        g = torch.Generator().manual_seed(seed)
        r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
        closes = bool(seed % 3)
        scale = (1, 1, 0, r(0, 2))
        tables = Tables(n, torch.device("cpu"), closes, scale)
        for slot in range(n):
            seq = lambda: tuple(r(0, vocab) for _ in range(r(1, 4)))
            t = {"start": seq(), "end": seq(), "initial": CLOSED if r(0, 3) else -r(0, 3),
                 "outs": (r(-3, 4), r(-3, 4)), "prompt_tail": r(0, 3)}
            tables.set(slot, t)
            tables.put_state(slot, tables.initial_state(t))
        tables.flush()
        dtype = torch.int32 if seed % 2 else torch.int64
        tokens = torch.randint(0, vocab, (n, max_len), generator=g).to(dtype)
        total = torch.randint(1, max_len + 1, (n,), generator=g).to(dtype)
        return tables, tokens, total, r(1, 6)
''')

exec(CASES)  # noqa: S102 - the same cases in this process and in the interpreter's


def _today(tables: SpanTables, tokens: torch.Tensor, total: torch.Tensor, rounds: int) -> torch.Tensor:
    """``DeviceThinking.step``'s rounds for one table, as they run without the fused op."""
    n = tokens.shape[0]
    thinking = DeviceThinking(n, torch.device("cpu"))
    state = tables.state[:n].clone()
    consts = tables.consts_of(n)
    for back in range(rounds - 1, -1, -1):
        window = thinking._window(tokens, total, tables.width, back)
        tables.advance(state, consts, window, total - back if back else total)
    return state


@pytest.mark.parametrize("seed", range(24))
def test_the_reference_equals_the_eager_rounds_of_a_step(seed: int) -> None:
    tables, tokens, total, rounds = case(seed, max_len=4 if seed % 4 == 1 else 24)  # type: ignore[name-defined]  # noqa: F821
    want = _today(tables, tokens, total, rounds)
    state = tables.state.clone()
    spans_advance_(state, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds)
    assert torch.equal(state, want)


def test_the_cases_move_states_both_ways() -> None:
    """The cases are not vacuous: most move some state, some open a span and some close one."""
    moved = opened = closed = 0
    for seed in range(24):
        tables, tokens, total, rounds = case(seed)  # type: ignore[name-defined]  # noqa: F821
        want = _today(tables, tokens, total, rounds)
        moved += not torch.equal(want, tables.state)
        opened += bool(((want[:, 2] == 1) & (tables.state[:, 2] == 0)).any())
        closed += bool(((want[:, 2] == 0) & (tables.state[:, 2] == 1)).any())
    assert moved >= 18 and opened >= 6 and closed >= 3, (moved, opened, closed)


def test_a_fused_advance_is_one_declared_launch() -> None:
    assert declared_launches("dynlogits::spans_advance_") == 1
    assert STATE == 4 and CLOSED < 0


SCRIPT = CASES + textwrap.dedent('''
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    from dynlogits.kernels.spans import advance_reference, launch
    bad = []
    for seed in range(40):
        tables, tokens, total, rounds = case(seed, n=70 if seed % 5 == 0 else 11, max_len=4 if seed % 4 == 1 else 24)
        want = tables.state.clone()
        advance_reference(want, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds)
        got = tables.state.clone()
        launch(got, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds)
        if not torch.equal(got, want):
            bad.append(seed)
    print("bad", bad)
    assert not bad
    from dynlogits.kernels.spans import _probe
    assert _probe(torch.device("cpu"))  # the probe's cases pass (and move states)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

