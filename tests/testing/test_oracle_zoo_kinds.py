"""The kit's oracle for ``multiple_choice``, ``trigger``, ``deadline`` and ``prompt_tokens``, written
from docs/specs.md apart from the processors: it says what the documented examples say, and agrees
with the processors (host path) over random histories."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from dynlogits import sdk
from dynlogits.testing.oracle import OracleRequest, expected_row

NEG = -math.inf
V = 16
EOS = 1
ROW = [float(i) for i in range(V)]


def finite(row: list[float]) -> list[int]:
    return [i for i, v in enumerate(row) if v != NEG]


MC = {"kind": "multiple_choice", "choices": [[5, 6], [5, 7, 8], [9]]}


@pytest.mark.parametrize(("history", "kept"), [
    ([], [5, 9]), ([5], [6, 7]), ([5, 6], [3]), ([5, 6, 3], [3]), ([5, 6, 3, 3], [3]), ([9, 9], []), ([6], []),
])
def test_multiple_choice_keeps_the_next_tokens_of_matching_choices_then_the_stop_token(history, kept) -> None:
    request = OracleRequest(stop_token_ids=(V + 2, 3, EOS))  # no eos_token_id: the first stop id in the row
    assert finite(expected_row([MC], history, ROW, request)) == kept


def test_trigger_forces_the_phrase_after_the_first_occurrence_only() -> None:
    e = {"kind": "trigger", "trigger_token_ids": [2, 3], "phrase_token_ids": [7, 8]}
    h = [4, 2, 3]
    assert finite(expected_row([e], h[:2], ROW)) == list(range(V))
    assert finite(expected_row([e], h, ROW)) == [7]
    assert finite(expected_row([e], h + [7], ROW)) == [8]
    assert finite(expected_row([e], h + [7, 8, 2, 3], ROW)) == list(range(V))


def test_deadline_forces_the_stop_token_from_arrival_plus_seconds() -> None:
    e = {"kind": "deadline", "seconds": 5}
    assert expected_row([e], [], ROW, OracleRequest(stop_token_ids=(4,), arrival=10.0, now=14.9)) == ROW
    assert finite(expected_row([e], [], ROW, OracleRequest(stop_token_ids=(4,), arrival=10.0, now=15.0))) == [4]


def test_prompt_tokens_boost_each_distinct_prompt_id_once_or_keep_only_them_and_the_stops() -> None:
    request = OracleRequest(prompt=(3, 3, 6, V + 1), stop_token_ids=(EOS,))
    boosted = expected_row([{"kind": "prompt_tokens", "mode": "boost", "boost": 1.5}], [], ROW, request)
    assert [b - r for b, r in zip(boosted, ROW)] == [1.5 if i in (3, 6) else 0.0 for i in range(V)]
    assert finite(expected_row([{"kind": "prompt_tokens", "mode": "restrict"}], [], ROW, request)) == [EOS, 3, 6]


PAYLOADS = [
    [MC],
    [{"kind": "multiple_choice", "choices": [[5, 6], [5], [6, 5, 6]], "eos_token_id": 2}],
    [{"kind": "trigger", "trigger_token_ids": [5, 6], "phrase_token_ids": [7, 5, 6]}],
    [{"kind": "trigger", "trigger_token_ids": [5], "phrase_token_ids": [5]}],
    [{"kind": "prompt_tokens", "mode": "boost", "boost": 4}],
    [{"kind": "prompt_tokens", "mode": "restrict"}],
    [{"kind": "deadline", "seconds": 3600}],
    [{"kind": "deadline", "seconds": 1}],
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{p[0]['kind']}-{len(str(p))}")
def test_the_oracle_agrees_with_the_processors_over_random_histories(payload) -> None:
    rng = random.Random(str(payload))
    prompt, arrival = (5, 6, 9, 5), time.time() - 1800  # half an hour ago: due after one second, not after an hour
    request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS,
                          facts=sdk.RequestFacts(prompt_ids=prompt, stop_token_ids=(EOS,), arrival_time=arrival))
    assert request is not None and request.processor is not None
    for _ in range(200):
        history = [rng.choice([5, 6, 7, 9, 2, EOS]) for _ in range(rng.randint(0, 6))]
        row = torch.tensor([rng.uniform(-3, 3) for _ in range(V)])
        want = expected_row(payload, history, row.tolist(),
                            OracleRequest(prompt=prompt, stop_token_ids=(EOS,), arrival=arrival, now=time.time()))
        request.processor(history, row)
        assert row.tolist() == pytest.approx(want), history
