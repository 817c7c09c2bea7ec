"""A scoped ``deadline`` (a clock-decided kind that opts in: ``DeadlineGroup.scopable``) is resident
on both vLLM runners (``scope.ScopedClock``): once due it forces the stop token only at its phase's
steps, as the hosted path (``_ScopedPlanned``: the processor called in phase only). With host
histories (the V1 runner) each row's phase is read from its live list; without (Model Runner V2)
the clock is read on the host per slot and, only once one is due, the rows ``DeviceThinking`` finds
in the entry's phase are forced, drafts or not."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from v2_rows import paired_requests, resident_request, rows_against_hosted, rows_v1_against_hosted, v1_left, v2_harness, v2_params

from dynlogits import sdk
from dynlogits.processors.scope import ScopedClock
from dynlogits.sdk.realization import RequestFacts

V = 48
EOS = 1
IDS = [2, 3, 5, 7, 3, 8, 6, 9]  # delimiters among them: phases change
#: due as soon as it is realized (a test never waits on the clock)
DUE = 1e-6


def _payload(rng: random.Random, seconds: float = DUE) -> list[dict[str, Any]]:
    return [{"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
             "end_token_ids": [7, 8][: rng.randint(1, 2)]},
            {"kind": "deadline", "seconds": seconds, "scope": rng.choice(["reasoning", "answer"])}]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> Any:
    made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt, stop_token_ids=(EOS,)))
    assert made is not None
    return made


def _forced(a: torch.Tensor, _: torch.Tensor) -> int:
    return int((torch.isfinite(a).sum(1) == 1).sum())


def test_the_v1_runners_scoped_deadline_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, prompts (which may open a span), a due deadline scoped to either phase,
    live lists with placeholders: every request resident (``ScopedClock``); the stop token forced
    exactly at the rows in phase, as the hosted path."""
    rng = random.Random(5)

    requests = paired_requests(rng, lambda: _payload(rng), _realize, IDS)
    forced = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=12, placeholders=0.2,
                                    logits=lambda: torch.randn(3, V), same=torch.equal, changed=_forced)
    assert forced > 100


@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_deadline_rows_are_the_hosted_paths(drafts: int) -> None:
    """Random requests through vLLM's real Model Runner V2 classes (resumes, reused slots, drafts):
    every request resident, each row forced exactly where the hosted path forces it, nothing read back."""
    rng = random.Random(23 + drafts)

    new = resident_request(rng, lambda: _payload(rng), _realize, IDS)
    assert rows_against_hosted(drafts, rng, new, IDS, vocab=V, eos=EOS, max_tokens=48,
                               logits=lambda rows: torch.randn(rows, V)) > 20


PAYLOAD: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                 {"kind": "deadline", "seconds": DUE, "scope": "answer"}]


def test_a_due_scoped_deadline_forces_the_stop_token_only_in_its_phase() -> None:
    """The V1 runner's interface: in reasoning (``5 3``) the row is left whole; in the answer
    (``5 3 7``) only the stop token is left."""
    batch, left = v1_left(_realize(PAYLOAD, [2]), ([5, 3], [5, 3, 7]), V)
    assert all(isinstance(g, ScopedClock) for g in batch.groups.values())
    assert left == [list(range(V)), [EOS]]


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_scoped_deadline_not_yet_due_leaves_every_row(drafts: int) -> None:
    """Due in an hour: no row is touched, in phase or not."""
    harness = v2_harness(drafts, V)
    harness.add_request("a", [2], v2_params([PAYLOAD[0], {**PAYLOAD[1], "seconds": 3600}], 16, EOS), output_ids=[5, 3, 7])
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    logits = torch.randn(1, V)
    assert torch.equal(harness.step(["a"], logits.clone()), logits)


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_due_scoped_deadline_forces_the_stop_token_only_in_its_phase(drafts: int) -> None:
    harness = v2_harness(drafts, V)
    harness.add_request("a", [2], v2_params(PAYLOAD, 16, EOS), output_ids=[5, 3])
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    left = []
    for token in (None, 7):
        if token is not None:
            harness.commit("a", [token])
        out = harness.step(["a"], torch.zeros(1, V))
        left.append(torch.isfinite(out[0]).nonzero().flatten().tolist())
    assert left == [list(range(V)), [EOS]]
