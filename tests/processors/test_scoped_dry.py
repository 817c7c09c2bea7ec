"""A scoped ``dry`` entry (``DryGroup.scopable``, ``neutral_history``; ``floored``,
``apply_floored``) is resident (``scope.ScopedDecided``) and lowers exactly as the hosted path
(the inner processor on its phase's stretch, ``_own``: ``dry.factory`` drops the prompt with a
scope, so no repeat reaches below the stretch's start): on the V1 runner's interface (host
histories) and, through vLLM's real Model Runner V2 classes (``V2SamplerHarness``), decided on the
device from each row's floor, drafts or not, prompts opening a span, resumed outputs.

``dry``'s processor has no ``row_op`` (its lowering is no ``RowOp``): ``scope.scoped`` wraps it as
a ``_ScopedResidentCalled`` (called where hosted)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from v2_rows import Request, paired_requests, rows_against_hosted, rows_v1_against_hosted, v2_harness, v2_params

from dynlogits import sdk
from dynlogits.processors.dry_group import DryGroup
from dynlogits.processors.scope import ScopedDecided
from dynlogits.processors.vocabulary import Vocabulary
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

#: ``:`` (3) breaks alone; ``<`` (4) breaks when ``br>`` (5) follows; 5 opens reasoning, 7 closes it
VOCAB = ("a", "b", "c", ":", "<", "br>", "y", "<br>", "d", "e", "f", "g", "h", "i", "j", "k")
V = len(VOCAB)
EOS = 15
IDS = [0, 1, 2, 3, 5, 7, 0, 1, 2, 8, 0, 1]  # few ids, a breaker, the delimiters: repeats, phases change
V2_IDS = [0, 1, 2, 0, 1, 5, 7, 0, 1, 8]  # no breaker (the V2 harness gives no vocabulary)


def _vocabulary() -> Vocabulary:
    return Vocabulary(lambda: VOCAB)


def _payload(rng: random.Random, *, bases: tuple[float, ...] = (1.75, 3.0),
             breakers: tuple[tuple[str, ...], ...] = ((), (":",), (":", "<br>"))) -> list[dict[str, Any]]:
    reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                 "end_token_ids": [7, 8][: rng.randint(1, 2)]}
    entry = {"kind": "dry", "multiplier": rng.choice([0.8, 3.0]), "base": rng.choice(bases),
             "allowed_length": rng.randint(1, 3), "penalty_last_n": rng.choice([-1, 4, 16]),
             "sequence_breakers": list(rng.choice(breakers)), "scope": rng.choice(["reasoning", "answer"])}
    return [reasoning, entry]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> Any:
    made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS,
                       facts=sdk.RequestFacts.of(prompt_ids=prompt, eos_token_id=EOS, vocabulary=_vocabulary()))
    assert made is not None
    return made


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_the_v1_runners_scoped_dry_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, prompts (which may open a span), settings and breakers (multi-token ones
    too: the host decides any), scoped to either phase; histories through both phases, each the
    engine's live list (grown in place, its newest slot sometimes a placeholder replaced at the
    next step) or a copy, some with a placeholder at the end; non-finite logits. Every request is
    resident; every row equals the hosted path's bit for bit."""
    rng = random.Random(7)

    requests = paired_requests(rng, lambda: _payload(rng), _realize, IDS, longest_prompt=5)
    def logits() -> torch.Tensor:
        made = torch.randn(3, V) * 3
        made[0, 1], made[1, 2], made[2, 0] = float("-inf"), float("nan"), float("inf")
        return made

    lowered_rows = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=20, placeholders=0.2, logits=logits,
                                          same=_same,
                                          changed=lambda a, step: int(((a != step) & ~step.isnan()).any(1).sum()))
    assert lowered_rows > 60  # rows in scope with repeats were seen


@pytest.mark.parametrize("where", ["reasoning", "answer"])
def test_a_scoped_dry_lowers_only_the_repeats_of_its_phases_current_stretch(where: str) -> None:
    """Allowed length 1, delimiters 5 and 7, no breakers; the output ``0 1 5 0 1 0``: in reasoning the
    stretch ``0 1 0`` repeats ``0`` (followed by 1): 1 lowered where scoped to reasoning, nothing
    where scoped to the answer. After ``7 0``: the answer's stretch is ``0`` (the earlier ``0 1``
    do not count): nothing lowered either way; after one more ``0``: 0 lowered in the answer."""
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "dry", "multiplier": 1.0, "allowed_length": 1,
                                      "sequence_breakers": [], "scope": where}]
    request = _realize(payload, [0, 1])
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    lowered = []
    for history in ([0, 1, 5, 0, 1, 0], [0, 1, 5, 0, 1, 0, 7, 0], [0, 1, 5, 0, 1, 0, 7, 0, 0]):
        logits = torch.zeros(1, V)
        batch.apply(logits, EngineStep(histories=[history]))
        lowered.append((logits[0] < 0).nonzero().flatten().tolist())
    assert lowered == ([[1], [], []] if where == "reasoning" else [[], [], [0]])


def test_the_v1_runner_writes_no_device_tables_for_a_scoped_dry() -> None:
    """With host histories nobody reads the window tables (a slot's breakers may be thousands of
    ids): the inner group never decides from the window, and its slots' tables stay unwritten."""
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "dry", "multiplier": 1.0, "sequence_breakers": [":"], "scope": "answer"}]
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, _realize(payload, [0, 1]))
    batch.flush()
    batch.set_rows(np.array([0]))
    batch.apply(torch.zeros(1, V), EngineStep(histories=[[0, 1, 0, 0]]))
    (group,) = batch.groups.values()
    assert isinstance(group, ScopedDecided) and isinstance(group.inner, DryGroup)
    assert not group.inner.from_window and not group.inner._dims  # no slot's window tables written


# -- Model Runner V2 (vLLM's real V2 classes, the runner's buffers as plain tensors) -----------------
def _v2_harness(drafts: int) -> Any:
    return v2_harness(drafts, V)


def _params(payload: list[dict[str, Any]], max_tokens: int) -> Any:
    return v2_params(payload, max_tokens, EOS)


def _run_v2(drafts: int, seed: int, bases: tuple[float, ...]) -> int:
    """Random requests without breakers (the harness gives no vocabulary) through a V2 harness
    (slots reused, outputs a request resumes with, drafts), each resident where the device decides
    it (base 1 with the whole context's look-back: repeats past ``MAX_DEVICE_CAP``, hosted); every
    row against the hosted path on the history it sees; how many rows were lowered."""
    rng = random.Random(seed)

    def new() -> Request:
        payload = _payload(rng, bases=bases, breakers=((),))
        prompt = [rng.choice(V2_IDS) for _ in range(rng.randint(1, 5))]
        output = [rng.choice(V2_IDS) for _ in range(rng.choice([0, 1, 3, 20]))]
        resident = payload[1]["base"] > 1.0 or payload[1]["penalty_last_n"] > 0
        return payload, resident, prompt, output, _realize(payload, prompt)

    def logits(rows: int) -> torch.Tensor:
        made = torch.randn(rows, V) * 3
        made[0, 2] = float("-inf")
        return made

    return rows_against_hosted(drafts, rng, new, V2_IDS, vocab=V, eos=EOS, max_tokens=64, logits=logits, same=_same)


@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_dry_rows_are_decided_on_the_device_as_the_hosted_path(drafts: int) -> None:
    """Every request resident (no history read back), every row equal to the hosted path's bit for bit."""
    assert _run_v2(drafts, 11 + drafts, (1.75, 3.0)) > 8


@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_dry_rows_beside_hosted_ones_are_each_the_hosted_paths(drafts: int) -> None:
    """Base 1 over the whole context (hosted) beside resident requests in one batch: the hosted
    requests' rows are no member of the scoped group, and every row is the hosted path's."""
    assert _run_v2(drafts, 31 + drafts, (1.0, 1.75)) > 8


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_reasoning_span_the_prompt_opened_counts_from_the_output(drafts: int) -> None:
    """Allowed length 1 scoped to reasoning, the prompt ``1 5 0`` opening the span before its last
    token (the stretch is the output: the prompt's ``0`` is no token of it): after ``0`` nothing
    (one token), after ``0 1`` nothing (``1`` repeats nothing), after ``0 1 0`` 1 lowered; once ``7``
    closes the span, nothing, even after ``0`` (a row out of phase: its floor past every position)."""
    harness = _v2_harness(drafts)
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "dry", "multiplier": 1.0, "allowed_length": 1,
                                      "sequence_breakers": [], "scope": "reasoning"}]
    harness.add_request("a", [1, 5, 0], _params(payload, 16))
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    lowered = []
    for token in (0, 1, 0, 7, 0, 1):
        out = harness.step(["a"], torch.zeros(1, V))
        lowered.append((out[0] < 0).nonzero().flatten().tolist())
        harness.commit("a", [token])
    assert lowered == [[], [], [], [1], [], []]
