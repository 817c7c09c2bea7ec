"""Scoped entries of plain kinds (``banned_tokens``, ``logit_bias``, ``allowed_tokens``) and of the
positional ones (``forced_sequence``, ``min_tokens``) are resident
on both vLLM runners (``dynlogits.processors.scope.ScopedGroup``): on the V1 runner each row's phase is
decided on the host from its live history and the rows in scope go up in one upload; under Model
Runner V2 phases are followed on the device (``DeviceThinking`` with ``ScopeTables``). Neither reads
anything back (the CUDA model), and the V1 runner's rows equal the hosted path's bit for bit. (Model
Runner V2's rows against the oracle: ``tests/adapters/vllm/test_vllm_model_runner_v2.py``.)"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from v2_rows import v1_batch, v1_step

from dynlogits import sdk
from dynlogits.sdk.realization import RequestFacts
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.testing.cuda.drive import EOS, Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda
from dynlogits.tools.bench import workloads

V = 48


def _scoped(seed: int) -> list[dict]:
    return workloads.payload("scoped", vocab_size=256, eos_token_id=EOS, seed=seed)


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_requests_are_resident_and_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=256, payloads=[_scoped(i) for i in range(4)], steps=9))
    assert [str(s) for s in result.syncs] == []


def _positional(seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
            {"kind": "forced_sequence", "token_ids": rng.sample(range(10, 60), 3), "eos_token_id": EOS, "scope": "answer"},
            {"kind": "min_tokens", "min_tokens": 4, "stop_token_ids": [EOS], "scope": "reasoning"}]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_positional_requests_are_resident_and_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    """``forced_sequence`` and ``min_tokens`` scoped to a phase count from its stretch: on the V1
    runner from the live lists, under Model Runner V2 from the span state on the device."""
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=256, payloads=[_positional(i) for i in range(4)], steps=9))
    assert [str(s) for s in result.syncs] == []


def test_the_v1_runners_scoped_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, prompts that may leave a span open, histories through both phases (and a
    placeholder at the end of some), the three plain kinds and the two positional ones
    (``forced_sequence``, ``min_tokens``: counted from their stretch) scoped to either phase, each
    request resident."""
    rng = random.Random(3)
    ids = [2, 3, 4, 5, 6, 7, 8]
    resident_rows = 0
    for _ in range(40):
        payloads = []
        for _ in range(3):
            reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                         "end_token_ids": [7, 8][: rng.randint(1, 2)]}
            scope = rng.choice(["reasoning", "answer"])
            entry = rng.choice([
                {"kind": "banned_tokens", "token_ids": rng.sample(range(10, 20), 3), "scope": scope},
                {"kind": "logit_bias", "bias": {str(i): rng.choice([-2.5, 1.5]) for i in rng.sample(range(10, 20), 2)},
                 "scope": scope},
                {"kind": "allowed_tokens", "token_ids": [5, 6, 7, 8, *rng.sample(range(10, 30), 5)],
                 "eos_token_id": EOS, "scope": scope},
                # positional: they count from their phase's stretch
                {"kind": "forced_sequence", "token_ids": rng.sample(range(10, 20), rng.randint(1, 4)),
                 "eos_token_id": EOS, "scope": scope},
                {"kind": "min_tokens", "min_tokens": rng.randint(1, 6), "stop_token_ids": [EOS, 9], "scope": scope},
            ])
            payloads.append([reasoning, entry])
        prompts = [[rng.choice(ids) for _ in range(rng.randint(1, 4))] for _ in payloads]
        resident = [sdk.realize(p, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=q)) for p, q in zip(payloads, prompts)]
        made = [sdk.realize(p, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=q)) for p, q in zip(payloads, prompts)]
        hosted = [r for r in made if r is not None]
        assert len(hosted) == len(made)
        batch = v1_batch(resident, V)
        histories: list[list[int]] = [[], [], []]
        for _ in range(12):
            for h in histories:
                h.append(rng.choice(ids))
            seen = [h + [-1] if rng.random() < 0.2 else list(h) for h in histories]
            logits = torch.randn(3, V)
            a, b = v1_step(batch, hosted, seen, logits)
            assert torch.equal(a, b)
            resident_rows += int((a != logits).any(1).sum())
    assert not any(r is None or r.failed for r in resident)
    assert resident_rows > 50  # rows in scope were seen


@pytest.mark.parametrize("phase", ["reasoning", "answer"])
def test_a_scoped_allowed_set_the_grammar_empties_fails_on_both_paths_only_in_its_phase(phase: str) -> None:
    """allowed {10, 11} + EOS scoped to the answer; the grammar masks all three: a row in the answer
    has no token left (both paths fail the request and leave the row alike), a row in reasoning is
    left as it is."""
    payload = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
               {"kind": "allowed_tokens", "token_ids": [10, 11], "eos_token_id": EOS, "scope": "answer"}]
    history = [3, 5, 4] if phase == "reasoning" else [3, 5, 4, 7]
    resident = sdk.realize(payload, vocab_size=V, stop_token_id=EOS)
    hosted = sdk.realize(payload, vocab_size=V, stop_token_id=EOS)
    assert resident is not None and hosted is not None
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(1, resident)
    batch.flush()
    batch.set_rows(np.array([1]))
    logits = torch.randn(1, V)
    logits[0, [10, 11, EOS]] = float("-inf")
    a, b = logits.clone(), logits.clone()
    batch.apply(a, EngineStep(histories=[history]))
    sdk.apply_rows(b, [0], [hosted], [history])
    assert resident.failed == hosted.failed == (phase == "answer")
    assert torch.equal(a, b)


@pytest.mark.parametrize("entries", [1, 2], ids=["one-scoped-entry", "two-scoped-entries"])
def test_the_v2_steady_step_follows_each_span_once_from_one_read_of_the_token_matrix(entries: int) -> None:
    """Model Runner V2, no drafts: each table's span is advanced once, reading the engine's token
    matrix inside it (one ``spans_advance_`` a table, declared one launch; no window read, no round
    of eager ops), and a scoped entry's rows read their phase off the state (one ``index`` each);
    the rest is the inner kind's own step."""
    payloads = [_scoped(i) for i in range(4)]
    if entries == 2:  # a second scoped kind at another entry position: a second table
        payloads = [[*p, {"kind": "logit_bias", "bias": {"9": 1.5}, "scope": "reasoning"}] for p in payloads]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=256, payloads=payloads, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    follow = ops[: ops.index("logical_and") - 1]  # the span following, before the first row decision
    assert follow == ["spans_advance_"] * entries  # one fused advance a table, nothing else
    assert "arange" not in ops and ops.count("logical_and") == entries and ops.count("spans_advance_") == entries


def test_under_speculative_decoding_a_step_follows_spans_for_at_most_one_round_per_row_a_request_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Model Runner V2 with 2 drafts a request (the speculative config says 2): a request commits at
    most 3 tokens by the next step, so each step's fused advance follows the committed span over 3
    rounds (not one per spare row of the step: 8 requests x 3 rows would allow 17)."""
    from dynlogits.processors import device_thinking

    rounds: list[int] = []
    advance = device_thinking.spans_advance_

    def recorded(*args: Any, **kwargs: Any) -> Any:
        rounds.append(args[6])  # (state, consts, tokens, total_len, scale, width, rounds, ...)
        return advance(*args, **kwargs)

    monkeypatch.setattr(device_thinking, "spans_advance_", recorded)
    payloads = [_scoped(i) for i in range(8)]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=256, payloads=payloads, steps=8, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert rounds and set(rounds) == {3}, rounds


_FORCED = {"kind": "forced_sequence", "token_ids": [5, 6, 7, 8, 9, 10, 11, 12], "eos_token_id": 1}
_REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}


@pytest.mark.parametrize(("drive", "drafts", "scoped", "most"),
                         [(drive_v1, 0, True, 5), (drive_v2, 0, True, 6), (drive_v2, 2, False, 9)],
                         ids=["v1-scoped", "v2-scoped", "v2-drafts"])
def test_a_forced_sequence_steps_gathered_rows_settle_in_one_fused_op(drive, drafts: int, scoped: bool,  # noqa: ANN001
                                                                       most: int) -> None:
    """A scoped ``forced_sequence`` (both runners), or one under drafts (the gathered layout), the
    last group of its rows: its rows' tokens picked, forced, the dead ones stopped and flagged in one
    ``decided_settle_`` (its sequence form: no ``index``, ``clamp``, ``index`` before it; no
    ``gather``/``scatter_`` of ``force_gathered``, no ``dead_rows_``), the flags copied back; no
    sync. Steady ops a step: the V1 runner 5 (was 19, then 8), Model Runner V2 6 (was 28, then 17:
    its stretch counts decided in the fused advance, ``STRETCH``), with 2 drafts a request unscoped
    9 (was 23, then 13)."""
    payload: list[dict[str, Any]] = [_REASONING, {**_FORCED, "scope": "answer"}] if scoped else [_FORCED]
    with SimCuda() as sim:
        kw = {"drafts": drafts} if drafts else {}
        steady = drive(sim, Scenario(vocab=64, payloads=[payload, payload], steps=7 if drafts else 4, changes=False),
                       **kw)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops.count("decided_settle_") == 1 and ops[-1] == "copy_", ops
    assert not {"gather", "scatter_", "dead_rows_", "masked_fill_"} & set(ops), ops
    assert len(ops) <= most, ops
