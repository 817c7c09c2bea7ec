"""A scoped ``thinking_budget`` (``ThinkingBudgetGroup.scopable``) is resident on both vLLM runners
(``scope.ScopedSpan``), its rows the hosted path's bit for bit (``_ScopedPlanned``: the processor,
whose scanner was built with the prompt, called in phase only, on the current stretch alone). So at
every stretch's start the budget's automaton is as after the prompt: a span the prompt left open is
open again, its prompt tokens counted against the budget; out of phase nothing is forced. With host
histories (the V1 runner) each row is decided from its stretch; without (Model Runner V2)
``DeviceThinking`` restarts the automaton at each stretch (``ThinkingTables.restart_state``), drafts
or not, where that restart is exact (``restarts_exactly``: no delimiter straddles a stretch's start),
else the request is hosted."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from v2_rows import Request, paired_requests, rows_against_hosted, rows_v1_against_hosted, v1_left, v2_harness, v2_params

from dynlogits import sdk
from dynlogits.kernels.spans import GATE
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.scope import ScopedSpan, ScopedTemplate
from dynlogits.processors.thinking_budget import restarts_exactly
from dynlogits.sdk.realization import RequestFacts

V = 48
EOS = 1
#: reasoning delimiters (5, 6 open; 7, 8 close) and a budget's own (2, 3, 4 among them)
IDS = [2, 2, 3, 4, 5, 5, 6, 7, 8, 9]


def _payload(rng: random.Random) -> list[dict[str, Any]]:
    """Random reasoning delimiters; a budget on them (scoped to reasoning: the answer is refused at
    admission) or on delimiters of its own among the ids (either phase)."""
    reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                 "end_token_ids": [7, 8][: rng.randint(1, 2)]}
    budget: dict[str, Any] = {"kind": "thinking_budget", "budget": rng.randint(1, 3), "scope": "reasoning"}
    if rng.random() < 0.6:
        budget["start_token_ids"] = [rng.choice([2, 3, 5, 2]) for _ in range(rng.choice([1, 1, 2, 3]))]
        budget["end_token_ids"] = [rng.choice([3, 4, 4, 7]) for _ in range(rng.randint(1, 2))]
        budget["scope"] = rng.choice(["reasoning", "answer"])
    return [reasoning, budget]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> Any:
    made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt, stop_token_ids=(EOS,)))
    assert made is not None
    return made


def _admitted(rng: random.Random, payload: Callable[[], list[dict[str, Any]]]) -> Callable[[], list[dict[str, Any]]]:
    """``payload`` drawn again until admitted (a budget's own delimiters may be refused)."""
    def draw() -> list[dict[str, Any]]:
        while True:
            made = payload()
            try:
                sdk.realize(made, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=[9], stop_token_ids=(EOS,)))
            except Exception:  # noqa: BLE001  # refused at admission: draw another
                continue
            if made is not None:
                return made
    return draw


def _exact(made: Any) -> bool:
    """Whether the request's scoped budget restarts exactly (resident without host histories)."""
    return all(getattr(p.template.inner, "restarts_exactly", True) for p in made.processor.processors
               if isinstance(getattr(p, "template", None), ScopedTemplate))


def _choose(rng: random.Random, row: torch.Tensor) -> int:
    """The forced token where the row is forced (so end sequences are written out), else one of ``IDS``."""
    left = torch.isfinite(row).nonzero().flatten().tolist()
    return left[0] if len(left) == 1 else rng.choice(IDS)


def _forced(a: torch.Tensor, _: torch.Tensor) -> int:
    return int((torch.isfinite(a).sum(1) == 1).sum())


def test_the_v1_runners_scoped_thinking_budget_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, budgets and prompts (which may open either span), live lists with
    placeholders: every request resident (``ScopedSpan``), every row as the hosted path's."""
    rng = random.Random(7)
    requests = paired_requests(rng, _admitted(rng, lambda: _payload(rng)), _realize, IDS)
    forced = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=30, placeholders=0.2,
                                    logits=lambda: torch.randn(3, V), same=torch.equal, changed=_forced)
    assert forced > 50


def _new(rng: random.Random) -> Callable[[], Request]:
    """A ``new`` for ``rows_against_hosted``: an admitted payload, a prompt of 1 to 4 tokens (half of
    the time then the budget's start sequence and maybe a token), an output of 0, 1, 3 or 20 tokens (past ``MAX_DEVICE_CATCH_UP``); resident where its restart is exact."""
    draw = _admitted(rng, lambda: _payload(rng))

    def new() -> Request:
        made = draw()
        prompt = [rng.choice(IDS) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.5:  # the prompt opens the budget's span (its tokens count in each stretch)
            prompt += made[1].get("start_token_ids", made[0]["start_token_ids"]) + [9] * rng.randint(0, 1)
        output = [rng.choice(IDS) for _ in range(rng.choice([0, 1, 3, 20]))]
        hosted = _realize(made, prompt)
        return made, _exact(hosted), prompt, output, hosted

    return new


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_thinking_budget_rows_are_the_hosted_paths(drafts: int, path: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Random requests through vLLM's real Model Runner V2 classes (resumes, reused slots, drafts):
    each row forced exactly where the hosted path forces it; the spans' fused ops (their CPU
    implementations, as the CUDA model runs them) or eager ops."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    rng = random.Random(31 + drafts)
    assert rows_against_hosted(drafts, rng, _new(rng), IDS, vocab=V, eos=EOS, max_tokens=64,
                               logits=lambda rows: torch.randn(rows, V), choose=_choose) > 10


def test_a_restart_is_exact_unless_a_delimiter_can_straddle_a_stretchs_start() -> None:
    """The prompt's tail ending with a proper prefix of a delimiter (hosted, it stands before every
    stretch), or, with a span the prompt opened, an end inside the start past its first token (on the
    device, a start reaching back before the stretch): not exact. Else exact."""
    assert restarts_exactly((9,), (2, 3), (4,), None)
    assert not restarts_exactly((9, 2), (2, 3), (4,), None)
    assert not restarts_exactly((4,), (2, 3), (4, 5), -1)
    assert restarts_exactly((9, 9), (2, 4, 3), (4,), None)
    assert not restarts_exactly((9, 9), (2, 4, 3), (4,), -1)
    assert restarts_exactly((9, 9), (4, 2, 3), (4,), -1)  # at offset 0: never before the stretch


# -- one request, step by step ---------------------------------------------------------------------
#: reasoning on 5 .. 7; the budget on its own delimiters 2 .. 3, two tokens, in the answer
ANSWER = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
          {"kind": "thinking_budget", "start_token_ids": [2], "end_token_ids": [3], "budget": 2, "scope": "answer"}]
#: the budget on the reasoning delimiters, in reasoning
REASONING = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
             {"kind": "thinking_budget", "budget": 2, "scope": "reasoning"}]


def _left(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_on_the_v1_runner_a_scoped_budget_counts_within_its_stretch_only() -> None:
    """Reasoning ``5``: a span ``2`` opened there is not the answer's; in the answer (after ``7``) the
    budget's span ``2`` opens and after two tokens its end is forced; opened in reasoning and carried
    into the answer, it is not open there (the stretch does not hold its start)."""
    histories = ([5, 2, 9, 9], [5, 2, 9, 9, 7, 9], [5, 7, 2, 9], [5, 7, 2, 9, 9])
    batch, left = v1_left(_realize(ANSWER, [9]), histories, V)
    assert all(isinstance(g, ScopedSpan) for g in batch.groups.values())
    assert left == [list(range(V)), list(range(V)), list(range(V)), [3]]


def test_on_the_v1_runner_a_span_the_prompt_opened_is_open_again_at_each_stretch() -> None:
    """The prompt ``9 5 9`` opens reasoning, one prompt token in it (budget 2): ``7`` is forced after
    one generated token, and again one token into the next reasoning stretch; in the answer between
    them nothing, though the prompt's span with a budget of 1 is spent at once in every stretch."""
    histories = ([], [9], [9, 7, 9, 9, 5], [9, 7, 9, 9, 5, 9])
    _, left = v1_left(_realize(REASONING, [9, 5, 9]), histories, V)
    assert left == [list(range(V)), [7], list(range(V)), [7]]
    _, left = v1_left(_realize([REASONING[0], {**REASONING[1], "budget": 1}], [9, 5, 9]), ([], [9, 7], [9, 7, 5]), V)
    assert left == [[7], list(range(V)), [7]]


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_span_the_prompt_opened_is_open_again_at_each_stretch(
        drafts: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt ``9 5 9`` opens reasoning, one prompt token in it: the budget (2) is spent after one
    generated token, ``7`` forced; in the next reasoning stretch (``5`` again) the hosted scanner starts
    from the prompt's state: the span is open with that prompt token counted, so ``7`` is forced
    after one token again. One token committed a step."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    harness = v2_harness(drafts, V)
    harness.add_request("a", [9, 5, 9], v2_params(REASONING, 32, EOS))
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    forced: list[tuple[int, list[int]]] = []
    for i, token in enumerate([None, 9, 7, 9, 9, 5, 9, 7, 9]):
        if token is not None:
            harness.commit("a", [token])
        left = _left(harness.step(["a"], torch.zeros(1, V)))
        if len(left) < V:
            forced.append((i, left))
    assert forced == [(1, [7]), (6, [7])]


def _steps(drafts: int, payload: list[dict[str, Any]], prompt: list[int], output: list[int],
           tokens: list[int]) -> tuple[bool, list[list[int]]]:
    """One request under V2 resumed with ``output``, then ``tokens`` committed one a step: whether it
    is resident, and per step (the first before any is committed) the ids its row leaves finite,
    each asserted to be the hosted path's on the same history."""
    harness = v2_harness(drafts, V)
    harness.add_request("a", prompt, v2_params(payload, 64, EOS), output_ids=output)
    hosted = _realize(payload, prompt)
    left = []
    for token in [None, *tokens]:
        if token is not None:
            harness.commit("a", [token])
        want = torch.zeros(1, V)
        sdk.apply_rows(want, [0], [hosted], [harness.output_ids("a")])
        got = harness.step(["a"], torch.zeros(1, V))
        assert torch.equal(got, want), harness.output_ids("a")
        left.append(_left(got))
    return bool(harness.processor._is_resident[harness.reqs["a"].slot]), left


#: the budget's span opened by the prompt ``2 9`` (a prompt token in it), its end ``5 4`` beginning
#: with the reasoning start: a reasoning stretch starts right after a ``5`` that is no part of it
STRADDLED = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
             {"kind": "thinking_budget", "start_token_ids": [2], "end_token_ids": [5, 4], "budget": 1,
              "scope": "reasoning"}]


@pytest.mark.parametrize("resumed", [0, 16], ids=["followed", "scanned"])
@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_an_end_begun_before_the_stretch_is_no_part_of_it(
        resumed: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reasoning opens (``5``): the budget, one prompt token spent, is due at once; the ``5`` before
    the stretch is no end begun (force ``5``, not ``4``), and ``4`` after it closes nothing (``5``
    forced again), as the hosted scanner sees the prompt's ``9`` there. Followed on the device from
    the output's start, or resumed past ``MAX_DEVICE_CATCH_UP`` (the host scan's state)."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    output = [9] * resumed + [5]
    assert resumed == 0 or len(output) > DeviceThinking.MAX_DEVICE_CATCH_UP
    resident, left = _steps(0, STRADDLED, [2, 9], output, [4])
    assert resident and left == [[5], [5]]


@pytest.mark.parametrize("resumed", [0, 15], ids=["followed", "scanned"])
@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_a_start_reaching_back_before_the_stretch_opens_nothing(
        resumed: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One token into the answer after ``7`` (followed on the device, or resumed there: the host
    scan's state), a start ``7 3 3`` completed by the next ``3`` began before the stretch: no span,
    nothing forced later, as the hosted path."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    payload = [STRADDLED[0], {"kind": "thinking_budget", "start_token_ids": [7, 3, 3], "end_token_ids": [4],
                              "budget": 1, "scope": "answer"}]
    output = [5, *[9] * resumed, 7, 3]
    assert resumed == 0 or len(output) > DeviceThinking.MAX_DEVICE_CATCH_UP
    resident, left = _steps(0, payload, [9], output, [3, 9, 9])
    assert resident and left == [list(range(V))] * 4


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_a_trigger_reaching_back_before_a_resumed_stretch_fires_nothing(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resumed state of a scoped ``trigger`` too (``ScopedSpanTables.host_state``): one token into
    the answer after ``7``, a trigger ``7 3 3`` completed by the next ``3`` began before the stretch:
    no phrase forced, as the hosted path (the processor fed the stretch alone)."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    payload = [STRADDLED[0], {"kind": "trigger", "trigger_token_ids": [7, 3, 3], "phrase_token_ids": [10, 11],
                              "scope": "answer"}]
    output = [5, *[9] * 15, 7, 3]
    assert len(output) > DeviceThinking.MAX_DEVICE_CATCH_UP
    resident, left = _steps(0, payload, [9], output, [3, 9])
    assert resident and left == [list(range(V))] * 3


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_a_budget_whose_start_the_prompts_tail_begins_is_hosted_under_model_runner_v2(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt ends with ``2``, the budget's start is ``2 3``: hosted, an answer beginning ``3``
    opens the span (the prompt's tail stands before every stretch), which no restart on the device
    can see: the request is hosted, and forces the end where the hosted path does."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    payload = [STRADDLED[0], {"kind": "thinking_budget", "start_token_ids": [2, 3], "end_token_ids": [4],
                              "budget": 1, "scope": "answer"}]
    resident, left = _steps(0, payload, [9, 2], [5, 7], [3, 9])
    assert not resident and left == [list(range(V)), list(range(V)), [4]]


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_a_budget_whose_end_lies_inside_its_start_after_a_prompt_opened_span_is_hosted_under_model_runner_v2(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt opens the budget's span (start ``5 4 3``, end ``4``) and reasoning (``5``): in the
    next reasoning stretch ``4`` closes the span and ``3`` after it is no start hosted (the prompt's
    ``9``, not the ``5`` that opened the stretch, stands before it), but on the device it would be:
    the request is hosted, and forces nothing after ``3``, as the hosted path."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    payload = [STRADDLED[0], {"kind": "thinking_budget", "start_token_ids": [5, 4, 3], "end_token_ids": [4],
                              "budget": 1, "scope": "reasoning"}]
    resident, left = _steps(0, payload, [5, 4, 3, 9], [7], [5, 4, 3, 9])
    assert not resident and left[3:] == [list(range(V))] * 2


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_a_request_resumed_in_a_later_stretch_counts_the_prompts_span(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed with more generated tokens than the device catches up on (its one host scan), in the
    second reasoning stretch one token in: the budget (3, one prompt token spent) is due after one
    more token, as the hosted path."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    harness = v2_harness(0, V)
    payload = [REASONING[0], {**REASONING[1], "budget": 3}]
    output = [9, 9, 7, *[9] * 14, 5, 9]
    assert len(output) > DeviceThinking.MAX_DEVICE_CATCH_UP
    harness.add_request("a", [9, 5, 9], v2_params(payload, 48, EOS), output_ids=output)
    assert _left(harness.step(["a"], torch.zeros(1, V))) == list(range(V))
    harness.commit("a", [9])
    assert _left(harness.step(["a"], torch.zeros(1, V))) == [7]
