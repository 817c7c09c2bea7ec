"""``dynlogits::spans_advance_`` (``dynlogits.kernels.spans``): its eager reference equals the eager
path of ``DeviceThinking.step`` (one window read and one ``SpanTables.advance`` a round) bit for
bit, and its decision equals the kinds' own ``decide_state`` (``trigger``'s phrase, ``thinking_budget``'s
due end token continuing an end already begun; a scoped entry's stretch count, ``STRETCH``, and
floor, ``FLOOR``, as ``StretchScopeTables`` and ``FloorScopeTables`` decide them); its Triton kernel, in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set in a subprocess before Triton is imported), equals the reference bit
for bit: random 1-3 token delimiters (closing or not, prompts opening spans, thresholds in the
prompt's tail), several rounds (speculative steps, a resumed request's catch-up: rounds past a short
row's start), int32 and int64 token matrices, a ``scale`` counting ``OUT`` from the transition, each
rule; and it compiles for Hopper and Ampere ahead of time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

from dynlogits.kernels.fused import declared_launches
from dynlogits.kernels.spans import DUE, FLOOR, NEVER, NO_RULE, PHRASE, STRETCH, decide_reference, spans_advance_
from dynlogits.processors.device_thinking import CLOSED, STATE, DeviceThinking, SpanTables, StepSource
from dynlogits.processors.scope import FloorScopeTables, ScopedTemplate, StretchScopeTables
from dynlogits.processors.slots import GatheredRows
from dynlogits.processors.thinking_budget import ThinkingBudgetTemplate, ThinkingTables
from dynlogits.processors.trigger import TriggerTables, TriggerTemplate

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
        window = thinking.window(tokens, total, tables.width, back)
        tables.advance(state, consts, window, total - back if back else total)
    return state


def _no_rule(tables: SpanTables) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``decided``, ``force``, ``force_len`` for a table without a rule (not read)."""
    decided = torch.full((tables.num_slots,), -1, dtype=torch.long)
    return decided, decided[:, None], decided[:, None]


@pytest.mark.parametrize("seed", range(24))
def test_the_reference_equals_the_eager_rounds_of_a_step(seed: int) -> None:
    tables, tokens, total, rounds = case(seed, max_len=4 if seed % 4 == 1 else 24)  # type: ignore[name-defined]  # noqa: F821
    want = _today(tables, tokens, total, rounds)
    state = tables.state.clone()
    decided, force, force_len = _no_rule(tables)
    spans_advance_(state, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds, decided, force,
                   force_len, NO_RULE)
    assert torch.equal(state, want) and bool((decided == -1).all())


def _ruled(kind: str, seed: int, n: int = 40, max_len: int = 20, vocab: int = 3) -> tuple[SpanTables, torch.Tensor,
                                                                                        torch.Tensor, torch.Tensor]:
    """A ``trigger`` or ``thinking_budget`` table of ``n`` random members (delimiters, phrases, ends
    of one to three tokens from ``vocab`` ids, budgets 0 to 2), each followed over its tokens (all
    rounds to its length): the tables, the token matrix, total lengths and each row's membership."""
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    seq = lambda: tuple(r(0, vocab) for _ in range(r(1, 4)))  # noqa: E731
    tables: SpanTables = (TriggerTables if kind == "trigger" else ThinkingTables)(n + 1, torch.device("cpu"))
    for slot in range(n):
        template: object = (TriggerTemplate(seq(), seq()) if kind == "trigger" else
                            ThinkingBudgetTemplate(seq(), seq(), r(0, 3), None if r(0, 3) else -r(0, 3), r(0, 3)))
        tables.set(slot, template)
        tables.put_state(slot, tables.initial_state(template))
    tables.flush()
    dtype = torch.int32 if seed % 2 else torch.int64
    tokens = torch.randint(0, vocab, (n, max_len), generator=g).to(dtype)
    total = torch.randint(0, max_len + 1, (n,), generator=g).to(dtype)
    decided, force, force_len = _no_rule(tables)
    spans_advance_(tables.state[:n], tables.consts.dev[:n], tokens, total, tables.scale_dev, tables.width, max_len,
                   decided[:n], force[:n], force_len[:n], NO_RULE)
    return tables, tokens, total, torch.rand(n, generator=g) < 0.95


def _kinds_own(tables: SpanTables, tokens: torch.Tensor, total: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Each slot's row's decision by the kind's ``decide_state`` (no draft before it)."""
    slots = torch.arange(tokens.shape[0])
    return tables.decide_state(slots, None, lambda: total[slots], member, StepSource(tokens, total * 0, total).token)


@pytest.mark.parametrize("kind", ["trigger", "thinking_budget"])
@pytest.mark.parametrize("seed", range(12))
def test_the_fused_decision_equals_the_kinds_own_decision(kind: str, seed: int) -> None:
    """``decide_reference`` (``PHRASE``, ``DUE``) equals ``decide_state`` of the row's slot on every
    row, members or not."""
    tables, tokens, total, member = _ruled(kind, seed)
    n = tokens.shape[0]
    forced = tables.forced()
    assert forced is not None and tables.rule == (PHRASE if kind == "trigger" else DUE)
    decided = torch.full((n,), -7, dtype=torch.long)
    decide_reference(tables.state[:n], tokens, total, decided, forced[0].dev[:n], forced[1].dev[:n], tables.rule)
    assert torch.equal(torch.where(member, decided, -1), _kinds_own(tables, tokens, total, member))


def _scoped(kind: str, seed: int, n: int = 40, max_len: int = 20, vocab: int = 3) -> tuple[SpanTables, torch.Tensor,
                                                                                         torch.Tensor, torch.Tensor]:
    """A scoped entry's table (``stretch``: a positional inner kind's, ``floor``: a window-decided
    one's) of ``n`` random members (delimiters of one to three tokens, either scope, prompts leaving
    a span open at their end or before it), each lifted by a random prompt length (its tokens none
    of the delimiters', as the host's prompt scan found them) and followed over its last 6
    generated tokens."""
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))  # noqa: E731
    seq = lambda: tuple(r(0, vocab) for _ in range(r(1, 4)))  # noqa: E731
    tables: SpanTables = (StretchScopeTables if kind == "stretch" else FloorScopeTables)(n + 1, torch.device("cpu"))
    for slot in range(n):
        template = ScopedTemplate(None, "reasoning" if r(0, 2) else "answer", seq(), seq(),  # type: ignore[arg-type]
                                  None if r(0, 2) else -r(0, 3))
        tables.set(slot, template)
        tables.put_state(slot, tables.initial_state(template))
    tables.flush()
    prompt = torch.randint(0, 4, (n,), generator=g)
    tables.lift(n, prompt[:, None])
    tables.prompt_len = prompt
    dtype = torch.int32 if seed % 2 else torch.int64
    tokens = torch.randint(0, vocab, (n, max_len), generator=g)
    tokens[torch.arange(max_len) < prompt[:, None]] = vocab  # the prompt's ids: none a delimiter's (as scanned)
    tokens = tokens.to(dtype)
    rounds = 6  # generated positions only (as a step's rounds: the prompt was the host's to scan)
    total = (prompt + rounds + torch.randint(0, max_len - 3 - rounds, (n,), generator=g)).to(dtype)
    decided, force, force_len = _no_rule(tables)
    spans_advance_(tables.state[:n], tables.consts.dev[:n], tokens, total, tables.scale_dev, tables.width, rounds,
                   decided[:n], force[:n], force_len[:n], NO_RULE)
    return tables, tokens, total, torch.rand(n, generator=g) < 0.9


@pytest.mark.parametrize("kind", ["stretch", "floor"])
@pytest.mark.parametrize("seed", range(12))
def test_the_fused_scope_decision_equals_the_scope_tables_own_decision(kind: str, seed: int) -> None:
    """``decide_reference`` (``STRETCH``, ``FLOOR``) equals ``decide_state`` of the row's slot on
    every row, members or not (a non-member: ``-1``, ``NEVER``, as ``DeviceThinking.decide`` gives
    it), and the cases hold rows in and out of phase, none starting before the output (a span the
    prompt opened: ``scope._from_output``)."""
    tables, tokens, total, member = _scoped(kind, seed)
    n = tokens.shape[0]
    assert tables.rule == (STRETCH if kind == "stretch" else FLOOR)
    decided = torch.full((n,), -7, dtype=torch.long)
    stand_in = decided[:, None]
    decide_reference(tables.state[:n], tokens, total, decided, stand_in, stand_in, tables.rule)
    own = _kinds_own(tables, tokens, total, member)
    assert torch.equal(torch.where(member, decided, tables.no_decision), own)
    none = -1 if kind == "stretch" else NEVER
    assert bool((own == none).any()) and bool((own != none).any())
    prompt = tables.prompt_len
    assert prompt is not None
    if kind == "stretch":  # a span the prompt opened counts from the output's start
        assert bool((own <= total - prompt).all())
    else:
        assert bool((own[own != NEVER] >= prompt[own != NEVER]).all())


def test_the_decision_cases_fire_and_continue_an_end_begun() -> None:
    """The cases are not vacuous: both kinds force in some rows, and some due ``thinking_budget``
    rows continue an end sequence the history already began (its second or third token)."""
    fired = {"trigger": 0, "thinking_budget": 0}
    begun = 0
    for kind in fired:
        for seed in range(12):
            tables, tokens, total, member = _ruled(kind, seed)
            want = _kinds_own(tables, tokens, total, member)
            fired[kind] += int((want >= 0).sum())
            if kind == "thinking_budget":
                first = tables.end.dev[: tokens.shape[0], 0]
                begun += int(((want >= 0) & (want != first)).sum())
    assert min(fired.values()) >= 10 and begun >= 5, (fired, begun)


class _Group:
    """What ``DeviceThinking.decide`` looks a table up by: an entry position and a type."""

    level = 0


def _rows(seed: int, n: int, later: int, vocab: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's rows: requests of 1 to ``1 + later`` rows in distinct slots (``slots``, ``member``),
    the tokens fed (a request's last committed one, then its drafts, some placeholders) and each
    row's drafts before it."""
    g = torch.Generator().manual_seed(seed)
    slots: list[int] = []
    local: list[int] = []
    for slot in torch.randperm(n, generator=g)[: n - 2].tolist():
        rows = int(torch.randint(1, later + 2, (1,), generator=g))
        slots += [slot] * rows
        local += list(range(rows))
    fed = torch.randint(-1, vocab, (len(slots),), generator=g)
    return torch.tensor(slots), torch.rand(len(slots), generator=g) < 0.9, fed, torch.tensor(local)


def _decide_both(tables: SpanTables, tokens: torch.Tensor, total: torch.Tensor, seed: int, later: int,
                 fed: bool) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``DeviceThinking.decide`` with drafts on its eager path and after a fused step
    (``spans_drafts_``), and the states and validity each passed ``decide_state`` (where called)."""
    n = tokens.shape[0]
    thinking = DeviceThinking(tables.num_slots, torch.device("cpu"), max_new=1 + later)
    thinking.tables[(0, _Group)] = tables  # type: ignore[index]
    thinking._step = StepSource(tokens, torch.zeros_like(total), total)
    slots, member, input_ids, local = _rows(seed, n, later)
    thinking._inputs = (input_ids if fed else None, local)
    passed: list[tuple[torch.Tensor, torch.Tensor]] = []
    own = tables.decide_state

    def recorded(slots: torch.Tensor, state: torch.Tensor | None, generated: Callable[[], torch.Tensor],
                 valid: torch.Tensor, row_tokens: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        assert state is not None
        passed.append((state.clone(), valid.clone()))
        return own(slots, state, generated, valid, row_tokens)

    tables.decide_state = recorded  # type: ignore[method-assign]
    decided = []
    for fused in (False, True):
        thinking._decided = fused
        decided.append(thinking.decide(_Group(), GatheredRows(slots, member)))  # type: ignore[arg-type]
    return decided[0], decided[1], passed


@pytest.mark.parametrize("rule", ["own", "none"])
@pytest.mark.parametrize("kind", ["trigger", "thinking_budget", "stretch", "floor"])
@pytest.mark.parametrize("seed", range(10))
def test_the_drafts_reference_equals_the_eager_decision_with_drafts(kind: str, seed: int, rule: str) -> None:
    """``spans_drafts_`` (its CPU implementation, the reference) decides every row as the eager path
    of ``DeviceThinking.decide`` with drafts: by the kind's rule (a scoped entry's ``STRETCH``,
    ``FLOOR`` too), or (without one) passing ``decide_state`` the same states and validity."""
    tables, tokens, total, _ = _ruled(kind, seed) if kind in ("trigger", "thinking_budget") else _scoped(kind, seed)
    if rule == "none":
        tables.rule = NO_RULE
    later = 1 + seed % 3
    eager, fused, passed = _decide_both(tables, tokens, total, seed, later, fed=seed % 4 != 3)
    assert torch.equal(eager, fused)
    if rule == "none":
        assert len(passed) == 2 and all(torch.equal(a, b) for a, b in zip(*passed, strict=True))


def test_the_drafts_cases_move_states_and_fire() -> None:
    """The drafts cases are not vacuous: drafts move some rows' states, some rows are not valid
    (a placeholder before them), and rows fire."""
    moved = invalid = fired = 0
    for seed in range(10):
        tables, tokens, total, _ = _ruled("thinking_budget", seed)
        tables.rule = NO_RULE
        eager, _, passed = _decide_both(tables, tokens, total, seed, 1 + seed % 3, fed=True)
        state, valid = passed[0]
        slots = _rows(seed, tokens.shape[0], 1 + seed % 3)[0]
        moved += int((state != tables.state[slots]).any(1).sum())
        invalid += int((~valid).sum())
        fired += int((eager >= 0).sum())
    assert moved >= 10 and invalid >= 10 and fired >= 10, (moved, invalid, fired)


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
    from dynlogits.kernels.spans import RULES, advance_reference, decide_reference, force_case, launch
    bad, fired = [], 0
    for seed in range(48):
        n = 70 if seed % 5 == 0 else 11
        tables, tokens, total, rounds = case(seed, n=n, max_len=4 if seed % 4 == 1 else 24)
        rule = RULES[seed % len(RULES)]
        decided, force, force_len = force_case(seed, n=tables.num_slots, width=1 + seed % 3, vocab=4)
        want, want_decided = tables.state.clone(), decided.clone()
        advance_reference(want, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds)
        decide_reference(want, tokens, total, want_decided, force, force_len, rule)
        got, got_decided = tables.state.clone(), decided.clone()
        launch(got, tables.consts.dev, tokens, total, tables.scale_dev, tables.width, rounds, got_decided, force,
               force_len, rule)
        fired += int((want_decided >= 0).sum())
        if not (torch.equal(got, want) and torch.equal(got_decided, want_decided)):
            bad.append(seed)
    print("bad", bad, "fired", fired)
    assert not bad and fired > 50
    from dynlogits.kernels.spans import drafts_same
    bad_drafts = [(seed, rule) for seed in range(24) for rule in RULES
                  if not drafts_same(torch.device("cpu"), seed, 1 + seed % 3, seed % 4, rule, fed=seed % 5 != 0)]
    print("bad drafts", bad_drafts)
    assert not bad_drafts
    from dynlogits.kernels.spans import _probe
    assert _probe(torch.device("cpu"))  # the probe's cases pass (and move states)
''')


def test_the_triton_kernel_in_the_interpreter_equals_the_reference_bit_for_bit() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]



#: the restart stage's arguments (``restarted_advance_rows``, ``restarted_drafts_rows``), after ``flen_s0``
RESTART_SIGNATURE = {"restart_ptr": "*i64", "restart_s0": "i64", "epoch_ptr": "*i64", "scope_ptr": "*i64",
                     "scope_s0": "i64", "prompt_ptr": "*i32"}


def _with_restart(signature: dict[str, str], restarted: bool) -> dict[str, str]:
    """``signature`` with the restart stage's arguments before its constexprs where ``restarted``."""
    if not restarted:
        return signature
    at = list(signature).index("WIDTH")
    items = list(signature.items())
    return dict(items[:at] + list(RESTART_SIGNATURE.items()) + items[at:])


@pytest.mark.parametrize("restarted", [False, True], ids=["advance_rows", "restarted_advance_rows"])
def test_the_triton_kernel_compiles_for_cuda_without_a_gpu(restarted: bool) -> None:
    """Triton's NVIDIA backend compiles the kernel ahead of time (Hopper and Ampere, each delimiter
    width and rule, int32 and int64 token matrices), and its variant with a scoped entry's restart
    stage: what the interpreter does not check (types, the compiler's lowering); not run."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import spans

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    name = "restarted_advance_rows" if restarted else "advance_rows"
    kernel = getattr(spans.kernels(), name)
    for capability in (90, 80):
        for tokens in ("*i32", "*i64"):
            signature = {"state_ptr": "*i64", "state_s0": "i64", "consts_ptr": "*i64", "consts_s0": "i64",
                         "tokens_ptr": tokens, "tokens_s0": "i64", "tokens_s1": "i64", "maxlen": "i32",
                         "total_ptr": tokens, "scale_ptr": "*i64",
                         "n": "i32", "rounds": "i32", "decided_ptr": "*i64", "force_ptr": "*i64", "force_s0": "i64",
                         "force_w": "i64", "flen_ptr": "*i64", "flen_s0": "i64", "WIDTH": "constexpr",
                         "BLOCK": "constexpr", "BIG": "constexpr", "CLOSED": "constexpr", "NEVER": "constexpr",
                         "RULE": "constexpr"}
            signature = _with_restart(signature, restarted)
            for width in (1, 2, 3, 5):
                for rule in spans.RULES:
                    source = ASTSource(fn=kernel, signature=signature,
                                       constexprs={"WIDTH": width, "BLOCK": spans.BLOCK, "BIG": spans.BIG,
                                                   "CLOSED": spans.CLOSED, "NEVER": spans.NEVER, "RULE": rule})
                    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                    assert name in compiled.asm["ptx"]


@pytest.mark.parametrize("restarted", [False, True], ids=["drafts_rows", "restarted_drafts_rows"])
def test_the_drafts_kernel_compiles_for_cuda_without_a_gpu(restarted: bool) -> None:
    """``spans_drafts_``'s kernel, as ``advance_rows`` above (with and without fed tokens)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dynlogits.kernels import spans

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("Triton has no NVIDIA backend here")
    name = "restarted_drafts_rows" if restarted else "drafts_rows"
    kernel = getattr(spans.kernels(), name)
    signature = {"state_ptr": "*i64", "state_s0": "i64", "consts_ptr": "*i64", "consts_s0": "i64", "tokens_ptr": "*i32",
                 "tokens_s0": "i64", "tokens_s1": "i64", "nslots": "i32", "maxlen": "i32", "total_ptr": "*i32",
                 "scale_ptr": "*i64", "slots_ptr": "*i64", "member_ptr": "*i1", "fed_ptr": "*i32", "n_fed": "i32",
                 "local_ptr": "*i32", "rows": "i32", "later": "i32", "out_ptr": "*i64", "out_s0": "i64",
                 "valid_ptr": "*i1", "decided_ptr": "*i64", "force_ptr": "*i64", "force_s0": "i64", "force_w": "i64",
                 "flen_ptr": "*i64", "flen_s0": "i64", "WIDTH": "constexpr", "BLOCK": "constexpr", "BIG": "constexpr",
                 "CLOSED": "constexpr", "NEVER": "constexpr", "PAD": "constexpr", "PLACEHOLDER": "constexpr",
                 "RULE": "constexpr", "HAS_FED": "constexpr"}
    signature = _with_restart(signature, restarted)
    for capability in (90, 80):
        for width in (1, 3):
            for rule in spans.RULES:
                for fed in (True, False):
                    source = ASTSource(fn=kernel, signature=signature,
                                       constexprs={"WIDTH": width, "BLOCK": spans.BLOCK, "BIG": spans.BIG,
                                                   "CLOSED": spans.CLOSED, "NEVER": spans.NEVER, "PAD": spans.PAD,
                                                   "PLACEHOLDER": spans.PLACEHOLDER, "RULE": rule, "HAS_FED": fed})
                    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                    assert name in compiled.asm["ptx"]
