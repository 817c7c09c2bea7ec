"""``trigger`` (docs/specs.md): the first time the output ends with the trigger, the phrase is forced,
one token a step; later occurrences do nothing. Host path, the resident path where the adapter gives
the histories (vLLM V1), and the device decider where it does not (Model Runner V2)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from zoo_rows import V, apply, finite, largest_allocation, logits_row, realize, resident_and_host

from dynlogits import sdk
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.trigger import TriggerProcessor, factory
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs import decode_wire_payload

TRIGGER, PHRASE = (3, 4), (7, 8, 9)
PAYLOAD = [{"kind": "trigger", "trigger_token_ids": list(TRIGGER), "phrase_token_ids": list(PHRASE)}]


def trigger_processor() -> TriggerProcessor:
    return TriggerProcessor(TRIGGER, PHRASE)


def forced(processor: TriggerProcessor, history: list[int]) -> int | None:
    """The token forced after ``history`` (``None``: the row is untouched)."""
    row = apply(processor, history)
    if torch.equal(row, logits_row()):
        return None
    (token,) = finite(row)
    assert row[token] == 0.0
    return token


def test_the_phrase_is_forced_after_the_first_occurrence_then_the_output_is_free() -> None:
    p = trigger_processor()
    history = [5, 3]
    assert forced(p, []) is None and forced(p, history) is None
    history.append(4)
    for token in PHRASE:
        assert forced(p, history) == token
        history.append(token)
    assert forced(p, history) is None
    history += [3, 4]  # a later occurrence does nothing
    assert forced(p, history) is None and forced(p, history + [6]) is None


def test_a_trigger_inside_the_phrase_or_overlapping_itself_counts_once() -> None:
    p = TriggerProcessor((3, 3), (3, 3, 5))
    assert [forced(p, [3] * n) for n in range(2, 5)] == [3, 3, 5]
    assert forced(p, [3, 3, 3, 3, 5]) is None


def test_a_prompt_ending_with_the_trigger_does_not_fire_it() -> None:
    request = realize(PAYLOAD, sdk.RequestFacts(prompt_ids=(9, 3, 4)))
    row = logits_row()[None].clone()
    sdk.apply_rows(row, [0], [request], [[]])
    assert torch.equal(row[0], logits_row())


def test_a_forced_token_the_engine_masked_stays_masked() -> None:
    row = logits_row()
    row[7] = float("-inf")
    trigger_processor()([3, 4], row)
    assert finite(row) == []


def test_a_history_that_shrinks_or_changes_is_followed() -> None:
    p = trigger_processor()
    assert forced(p, [1, 3, 4, 7]) == 8
    assert forced(p, [1, 3]) is None  # preempted before the trigger's end: not fired
    assert forced(p, [1, 3, 4]) == 7  # recomputed
    assert forced(p, [1, 3, 5, 3, 4]) == 7  # the first occurrence was rejected: the later one is first now
    assert forced(p, [2, 2, 2, 2, 2, 2, 2]) is None
    assert forced(p, [2, 2, 2, 3, 4, 7, 8]) == 9  # same length, other tokens: the trigger is there now


def test_draft_rows_of_one_request_are_each_decided_from_their_own_history() -> None:
    p = trigger_processor()
    committed = [6, 3]
    for drafts, token in [((), None), ((4,), 7), ((4, 7), 8), ((4, 7, 8), 9), ((4, 7, 8, 9), None)]:
        assert forced(p, committed + list(drafts)) == token
    # the drafts were rejected and another token committed: deeper than the trigger's length
    assert forced(p, [6, 3, 5, 5, 5, 5]) is None


def test_following_the_history_call_by_call_equals_scanning_it_afresh() -> None:
    rng = random.Random(0)
    p = trigger_processor()
    history: list[int] = []
    for _ in range(400):
        if history and rng.random() < 0.1:  # preemption: the history shrinks
            del history[rng.randrange(len(history)) :]
        elif history and rng.random() < 0.1:  # rejected drafts: some of the tail is replaced
            for i in range(rng.randrange(len(history)), len(history)):
                history[i] = rng.choice([3, 4, 5, 7])
        history.append(rng.choice([3, 4, 5, 7]))
        assert forced(p, history) == forced(trigger_processor(), history), history


def test_a_placeholder_not_yet_replaced_is_never_taken_for_the_trigger() -> None:
    p = trigger_processor()
    assert forced(p, [3, -1]) is None
    assert forced(p, [3, 4, -1]) == 8  # the placeholder stands for phrase[0], already forced


def test_each_request_gets_a_fresh_processor() -> None:
    (entry,) = decode_wire_payload(PAYLOAD)
    ctx = RealizeContext(vocab_size=V)
    a, b = factory(entry, ctx), factory(entry, ctx)
    assert a is not b
    assert forced(a, [3, 4]) == 7
    assert b.fired_at([0]) is None


def test_a_step_allocates_nothing_vocab_sized() -> None:
    vocab = 100_000
    p = trigger_processor()
    row = torch.zeros(vocab)
    p([3, 4], row)
    assert largest_allocation(lambda: p([3, 4], row)) < 4096


def test_the_resident_path_equals_the_host_path_step_by_step() -> None:
    history = [5, 3, 4, 7, 8, 9, 3, 4, 6]
    steps = [history[:n] for n in range(len(history) + 1)] + [[5, 3], [5, 3, 4]]  # and back after preemption
    for resident, host in resident_and_host(PAYLOAD, steps):
        assert torch.equal(resident, host)


@pytest.mark.parametrize(("output", "want"), [([5, 3, 4], 7), ([5, 3, 4, 7], 8), ([5, 3], None), ([3, 4, 7, 8, 9], None),
                                              ([4], None), ([4, 3, 4], 7)])
def test_without_the_rows_histories_a_trigger_request_is_decided_by_the_device_decider(
        output: list[int], want: int | None) -> None:
    """Model Runner V2: no host histories; ``DeviceThinking`` follows the trigger's span from the
    engine's token matrix. The prompt ``[3, 4, 3]`` holds the trigger and ends with its first token:
    neither counts (matched in the output only, as the host processor)."""
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    request = realize(PAYLOAD)
    assert batch.assign(0, request)  # resident: decided on the device
    decider = sdk.DeviceThinking(3, "cpu")
    decider.assign(0, request, resumed=len(output))
    batch.flush()
    decider.flush()
    prompt = [3, 4, 3]
    tokens = torch.zeros(2, 16, dtype=torch.int32)
    tokens[0, : len(prompt) + len(output)] = torch.tensor(prompt + output)
    decider.step(tokens, torch.tensor([len(prompt), 0]), torch.tensor([len(prompt) + len(output), 0]))
    batch.set_rows(np.array([0]))
    logits = torch.randn(1, V)
    before = logits.clone()
    batch.apply(logits, EngineStep(thinking=decider.decide))
    assert forced(trigger_processor(), output) == want  # the host processor's rule
    if want is None:
        assert torch.equal(logits, before)
    else:
        assert finite(logits[0]) == [want]


@pytest.mark.parametrize("masked", [7, None])
def test_a_resident_row_left_with_no_token_fails_its_request_at_its_position(masked: int | None) -> None:
    reports: list[str] = []
    request = sdk.realize(PAYLOAD, vocab_size=V, stop_token_id=1, report=reports.append)
    assert request is not None
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    logits = torch.randn(1, V)
    if masked is not None:
        logits[0, masked] = float("-inf")
    batch.apply(logits, EngineStep(histories=[[3, 4]]))
    sdk.drain()
    if masked is None:
        assert finite(logits[0]) == [7] and not request.failed
    else:
        assert finite(logits[0]) == [1] and request.failed
        assert "no token left to sample at output position 2" in reports[0]


@pytest.mark.parametrize("masked", [True, False], ids=["forced-token-masked", "forced-token-kept"])
def test_without_histories_the_fused_forcing_equals_the_eager_forcing(masked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model Runner V2's forcing and settle as one fused op (``decided_settle_``, its CPU
    implementation) writes the logits and fails the request as the eager ops and ``record_dead`` do:
    the phrase token forced, or, masked by the grammar, the request failed at its stop token."""
    from dynlogits.kernels import thinking_force

    def run(fused: bool) -> tuple[torch.Tensor, list[str]]:
        if fused:
            monkeypatch.setattr(thinking_force.GATE, "run", lambda device, fused, eager: fused())
        reports: list[str] = []
        request = sdk.realize(PAYLOAD, vocab_size=V, stop_token_id=1, report=reports.append)
        assert request is not None
        batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
        decider = sdk.DeviceThinking(3, "cpu")
        assert batch.assign(0, request)
        decider.assign(0, request, resumed=3)
        batch.flush()
        decider.flush()
        tokens = torch.zeros(2, 16, dtype=torch.int32)
        tokens[0, :6] = torch.tensor([3, 4, 3, 5, 3, 4])  # the output [5, 3, 4] ends with the trigger
        decider.step(tokens, torch.tensor([3, 0]), torch.tensor([6, 0]))
        batch.set_rows(np.array([0]))
        logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
        if masked:
            logits[0, PHRASE[0]] = float("-inf")
        batch.apply(logits, EngineStep(thinking=decider.decide))
        sdk.drain()
        monkeypatch.undo()
        return logits, reports

    eager, fused = run(False), run(True)
    assert torch.equal(eager[0], fused[0]) and eager[1] == fused[1]
    assert finite(fused[0][0]) == ([1] if masked else [PHRASE[0]]) and bool(fused[1]) == masked


def test_under_drafts_the_fused_forcing_equals_the_eager_forcing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model Runner V2 with drafts (vLLM's real V2 classes), the first phrase token masked in every
    row: the fused forcing and settle (``decided_settle_`` with the real-row mask, its CPU
    implementation) writes every row as the eager ops and ``record_dead`` do, and fails the same
    requests. At the first step only rows after a draft are triggered (``a``: ``5 3`` then the
    draft ``4``; ``b``: ``5`` then ``3 4``): they are left with no token and only stop (a draft may
    be rejected), no request fails; once ``a`` commits ``4`` its own row is triggered and it fails."""
    from v2_rows import v2_harness, v2_params

    from dynlogits.kernels import thinking_force

    def run(fused: bool) -> tuple[list[torch.Tensor], list[list[str]]]:
        if fused:
            monkeypatch.setattr(thinking_force.GATE, "run", lambda device, fused, eager: fused())
        gen = torch.Generator().manual_seed(11)
        harness = v2_harness(2, V)
        harness.add_request("a", [2], v2_params(PAYLOAD, 32, 1), output_ids=[5, 3])
        harness.add_request("b", [2], v2_params(PAYLOAD, 32, 1), output_ids=[5])
        outs: list[torch.Tensor] = []
        failures: list[list[str]] = []
        for fed, commit in (({"a": [4, 5], "b": [3, 4]}, {"a": 4, "b": 5}), ({"a": [], "b": []}, {"a": 5, "b": 5})):
            logits = torch.randn(2 + sum(map(len, fed.values())), V, generator=gen)
            logits[:, PHRASE[0]] = float("-inf")
            outs.append(harness.step(["a", "b"], logits, drafts=fed))
            sdk.drain()
            failures.append(list(harness.processor.failures))
            for name, token in commit.items():
                harness.commit(name, [token])
        monkeypatch.undo()
        return outs, failures

    eager, fused = run(False), run(True)
    for a, b in zip(eager[0], fused[0], strict=True):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert eager[1] == fused[1]
    first, second = fused[0]
    assert finite(first[1]) == [1] and finite(first[5]) == [1] and finite(first[2]) == [PHRASE[1]]  # drafts: stopped, forced
    assert fused[1][0] == [] and len(fused[1][1]) == 1 and "output position 3" in fused[1][1][0]
