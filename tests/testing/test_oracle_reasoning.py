"""The kit's oracle for reasoning phases, scopes and a thinking budget read from the prompt on, written
from docs/specs.md apart from the processors: it says what the documented examples say, and agrees
with the processors (host path) over random prompts and histories."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dynlogits import sdk
from dynlogits.testing.oracle import OracleRequest, expected_row

NEG = -math.inf
V = 16
EOS = 1
ROW = [float(i) for i in range(V)]
REASONING = {"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]}


def finite(row: list[float]) -> list[int]:
    return [i for i, v in enumerate(row) if v != NEG]


def test_a_thinking_budget_counts_the_thinking_tokens_of_the_prompt() -> None:
    """DeepSeek-R1 style: the prompt ends inside a span after one thinking token; a budget of 2 forces
    the end after one generated token; without delimiters it takes the request's reasoning ones."""
    for budget in ({"kind": "thinking_budget", "start_token_ids": [5], "end_token_ids": [6], "budget": 2},
                   {"kind": "thinking_budget", "budget": 2}):
        payload = [REASONING, budget]
        request = OracleRequest(prompt=(3, 5, 9))
        assert expected_row(payload, [], ROW, request) == ROW
        assert finite(expected_row(payload, [7], ROW, request)) == [6]
        assert expected_row(payload, [7], ROW) == ROW  # the same output after a prompt with no span: free


def test_a_scoped_entry_acts_in_its_phase_only_and_counts_from_its_stretch() -> None:
    payload = [REASONING, {"kind": "allowed_tokens", "token_ids": [8, 9], "eos_token_id": EOS, "scope": "answer"},
               {"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 6, "scope": "reasoning"}]
    opened = OracleRequest(prompt=(3, 5))
    assert finite(expected_row(payload, [], ROW, opened)) == [7]  # reasoning position 0
    assert finite(expected_row(payload, [7], ROW, opened)) == [6]  # reasoning position 1: its EOS, the end
    assert finite(expected_row(payload, [7, 6], ROW, opened)) == [EOS, 8, 9]  # the answer
    assert finite(expected_row(payload, [], ROW)) == [EOS, 8, 9]  # no span in the prompt: the answer at once
    assert finite(expected_row(payload, [8, 5], ROW)) == [7]  # a new span: the reasoning stretch starts again


PAYLOADS = [
    [{"kind": "thinking_budget", "start_token_ids": [5], "end_token_ids": [6, 7], "budget": 2}],
    [REASONING, {"kind": "thinking_budget", "budget": 1}],
    [{"kind": "reasoning", "start_token_ids": [5, 9], "end_token_ids": [6]}, {"kind": "thinking_budget", "budget": 3},
     {"kind": "banned_tokens", "token_ids": [9], "scope": "answer"}],
    [REASONING, {"kind": "allowed_tokens", "token_ids": [5, 8, 9], "eos_token_id": EOS, "scope": "answer"},
     {"kind": "banned_tokens", "token_ids": [8], "scope": "reasoning"}],
    [REASONING, {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [EOS], "scope": "answer"},
     {"kind": "logit_bias", "bias": {"9": 3.0}, "scope": "reasoning"}],
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: "-".join(e["kind"] for e in p) + f"-{len(str(p))}")
def test_the_oracle_agrees_with_the_processors_over_random_prompts_and_histories(payload) -> None:
    rng = random.Random(str(payload))
    for _ in range(150):
        prompt = tuple(rng.choice([3, 5, 6, 7, 9]) for _ in range(rng.randint(0, 5)))
        request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS,
                              facts=sdk.RequestFacts(prompt_ids=prompt, stop_token_ids=(EOS,)))
        assert request is not None and request.processor is not None
        history: list[int] = []
        for _ in range(8):
            row = torch.tensor([rng.uniform(-3, 3) for _ in range(V)])
            want = expected_row(payload, history, row.tolist(), OracleRequest(prompt=prompt, stop_token_ids=(EOS,)))
            request.processor(history, row)
            assert row.tolist() == pytest.approx(want), (prompt, history)
            kept = finite(want)
            if not kept:
                break
            history.append(rng.choice(kept))
