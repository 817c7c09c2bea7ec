"""``deadline`` (docs/specs.md): from ``seconds`` after the request arrived, its stop token is forced
at every step. An injectable clock for the processor; arrival times in the past or the future for
realized requests; one bounded wait on the clock."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from zoo_rows import EOS, V, apply, finite, largest_allocation, logits_row, realize, resident_and_host

from dynlogits import sdk
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.deadline import DeadlineProcessor, factory
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs import decode_wire_payload


class Clock:
    """A clock the test sets."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def entry(seconds: float) -> object:
    (decoded,) = decode_wire_payload([{"kind": "deadline", "seconds": seconds}])
    return decoded


def test_the_stop_token_is_forced_at_every_step_from_the_due_time_on() -> None:
    clock = Clock(1000.0)
    p = factory(entry(2.5), RealizeContext(vocab_size=V, stop_token_ids=(EOS, 9), arrival_time=998.0), clock)
    assert p.due == 1000.5
    assert torch.equal(apply(p, [4, 4]), logits_row())  # before: untouched
    clock.now = 1000.5
    for history in ([4, 4, 4], [4, 4, 4, 4], [4]):  # from then on, whatever the history (a preempted one too)
        row = apply(p, history)
        assert finite(row) == [EOS] and row[EOS] == 0.0


def test_without_an_arrival_the_clock_starts_at_realization() -> None:
    clock = Clock(50.0)
    p = factory(entry(10), RealizeContext(vocab_size=V, stop_token_ids=(EOS,)), clock)
    assert p.due == 60.0


def test_the_forced_token_is_the_requests_first_stop_id_inside_the_width_and_one_is_needed() -> None:
    p = factory(entry(1), RealizeContext(vocab_size=V, stop_token_ids=(V + 1, 9, 3), arrival_time=0.0), Clock())
    assert p.stop == 9
    with pytest.raises(ValueError, match="needs a stop token"):
        factory(entry(1), RealizeContext(vocab_size=V, stop_token_ids=(), arrival_time=0.0))


def test_a_stop_token_the_engine_masked_stays_masked() -> None:
    row = logits_row()
    row[EOS] = float("-inf")
    DeadlineProcessor(0.0, EOS, Clock(1.0))([], row)
    assert finite(row) == []


def test_each_request_gets_a_fresh_processor_due_after_its_own_arrival() -> None:
    a = factory(entry(5), RealizeContext(vocab_size=V, stop_token_ids=(EOS,), arrival_time=10.0))
    b = factory(entry(5), RealizeContext(vocab_size=V, stop_token_ids=(EOS,), arrival_time=20.0))
    assert a is not b and (a.due, b.due) == (15.0, 25.0)


def test_a_step_allocates_nothing_vocab_sized() -> None:
    vocab = 100_000
    p = DeadlineProcessor(0.0, EOS, Clock(1.0))
    row = torch.zeros(vocab)
    p([], row)
    assert largest_allocation(lambda: p([], row)) < 4096


PAYLOAD = [{"kind": "deadline", "seconds": 30}]


@pytest.mark.parametrize(("arrived_ago", "stops"), [(3600.0, True), (0.0, False)])
def test_the_resident_path_equals_the_host_path(arrived_ago: float, stops: bool) -> None:
    facts = sdk.RequestFacts(stop_token_ids=(EOS,), arrival_time=time.time() - arrived_ago)
    for resident, host in resident_and_host(PAYLOAD, [[], [5], [5, 6], [5]], facts=facts):
        assert torch.equal(resident, host)
        assert (finite(resident) == [EOS]) == stops


def test_a_request_due_while_it_runs_is_stopped_from_the_first_step_after_its_due_time() -> None:
    seconds = 0.3
    request = realize([{"kind": "deadline", "seconds": seconds}],
                      sdk.RequestFacts(stop_token_ids=(EOS,), arrival_time=time.time()))
    due = request.processor.processors[0].due  # type: ignore[union-attr]
    batch = SlotBatch(num_slots=1, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    history: list[int] = []
    logits = torch.randn(1, V)
    before, started = logits.clone(), time.time()
    batch.apply(logits, EngineStep(histories=[history]))
    if time.time() < due:  # the step ran before the due time (it may not have, on a loaded machine)
        assert torch.equal(logits, before)
    elif started >= due:
        assert finite(logits[0]) == [EOS]
    history.append(5)
    deadline = due + 10.0  # a bounded wait on the clock, never a fixed sleep
    while time.time() < due:
        assert time.time() < deadline
        time.sleep(min(0.01, max(0.0, due - time.time())))
    logits = torch.randn(1, V)
    batch.apply(logits, EngineStep(histories=[history]))
    assert finite(logits[0]) == [EOS] and logits[0, EOS] == 0.0


@pytest.mark.parametrize("layout", ["listed", "gathered"])
@pytest.mark.parametrize(("arrived_ago", "stops"), [(3600.0, True), (0.0, False)])
def test_a_deadline_is_resident_without_histories_as_it_reads_none(layout: str, arrived_ago: float, stops: bool) -> None:
    """Model Runner V2 gives no histories: the clock is read on the host per row (listed) or per
    slot (gathered, only the device knows the rows); a request not yet due costs no device op."""
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    facts = sdk.RequestFacts(stop_token_ids=(EOS,), arrival_time=time.time() - arrived_ago)
    assert batch.assign(1, realize(PAYLOAD, facts))
    batch.flush()
    if layout == "listed":
        batch.set_rows(np.array([-1, 1]))
        rows = {}
    else:
        batch.rows_on_device(torch.tensor([0, 1, 1]), np.array([0, 1]))  # slot 1 with a draft row
        rows = {"real_rows": torch.tensor([True, True, False])}
    logits = torch.randn(2 if layout == "listed" else 3, V)
    before = logits.clone()
    batch.apply(logits, EngineStep(generated=torch.tensor([3] * len(logits)), **rows))
    assert torch.equal(logits[0], before[0])  # slot 0 holds no resident request
    for row in range(1, len(logits)):
        assert finite(logits[row]) == ([EOS] if stops else finite(before[row]))
