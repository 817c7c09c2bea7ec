"""``multiple_choice`` (docs/specs.md): the output is exactly one of the choices, then EOS."""

from __future__ import annotations

import pytest
import torch
from zoo_rows import EOS, V, apply, finite, largest_allocation, logits_row, realize, resident_and_host

from dynlogits import sdk
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.multiple_choice import MultipleChoiceProcessor, factory
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.specs import decode_wire_payload

CHOICES = ((5, 6, 7), (5, 8), (9,), (5, 6))


def choice_processor() -> MultipleChoiceProcessor:
    return MultipleChoiceProcessor(CHOICES, EOS)


@pytest.mark.parametrize(("history", "allowed"), [
    ([], [5, 9]),
    ([5], [6, 8]),
    ([5, 6], [EOS, 7]),  # (5, 6) is whole, (5, 6, 7) goes on
    ([5, 6, 7], [EOS]),
    ([5, 8], [EOS]),
    ([9], [EOS]),
])
def test_each_step_allows_the_next_token_of_every_choice_still_matched_and_eos_after_a_whole_one(
        history: list[int], allowed: list[int]) -> None:
    row = apply(choice_processor(), history)
    assert finite(row) == allowed
    assert torch.equal(row[allowed], logits_row()[allowed])  # the allowed ids keep their values


def test_after_eos_closes_a_choice_eos_is_allowed_again_and_nothing_else() -> None:
    p = choice_processor()
    assert finite(apply(p, [5, 8, EOS])) == [EOS]
    assert finite(apply(p, [5, 8, EOS, EOS, EOS])) == [EOS]


@pytest.mark.parametrize("history", [[7], [5, 9], [9, 9], [5, 6, 7, 7], [EOS]])
def test_an_output_that_left_every_choice_keeps_no_token(history: list[int]) -> None:
    assert finite(apply(choice_processor(), history)) == []


def test_a_token_the_engine_masked_stays_masked() -> None:
    row = logits_row()
    row[9] = float("-inf")
    choice_processor()([], row)
    assert finite(row) == [5]


def test_a_shorter_history_after_preemption_and_draft_rows_of_one_request_each_get_their_own_step() -> None:
    p = choice_processor()
    assert finite(apply(p, [5, 6, 7])) == [EOS]
    assert finite(apply(p, [5])) == [6, 8]  # preempted and recomputed from a shorter history
    committed = [5]
    for drafts, allowed in [((), [6, 8]), ((6,), [EOS, 7]), ((6, 7), [EOS])]:  # one row per draft, one step
        assert finite(apply(p, committed + list(drafts))) == allowed


def test_the_factory_takes_the_entrys_eos_else_the_requests_first_stop_token_inside_the_width() -> None:
    with_eos, without = decode_wire_payload([{"kind": "multiple_choice", "choices": [[5]], "eos_token_id": 3},
                                             {"kind": "multiple_choice", "choices": [[5]]}])
    ctx = RealizeContext(vocab_size=V, stop_token_ids=(V + 4, 7, 2))
    assert finite(apply(factory(with_eos, ctx), [5])) == [3]
    assert finite(apply(factory(without, ctx), [5])) == [7]
    with pytest.raises(ValueError, match="no stop token"):
        factory(without, RealizeContext(vocab_size=V, stop_token_ids=(V,)))


def test_each_request_gets_a_fresh_processor() -> None:
    (entry,) = decode_wire_payload([{"kind": "multiple_choice", "choices": [[5, 6]], "eos_token_id": EOS}])
    ctx = RealizeContext(vocab_size=V)
    assert factory(entry, ctx) is not factory(entry, ctx)


def test_a_repeated_choice_set_shares_its_tables_and_each_processor_keeps_its_own_indices() -> None:
    first, again = MultipleChoiceProcessor(CHOICES, EOS), MultipleChoiceProcessor([list(c) for c in CHOICES], EOS)
    assert again.template is first.template and again._children is first._children  # built once, read only
    assert again._keep is not first._keep  # index tensors: per processor
    other_eos = MultipleChoiceProcessor(CHOICES, EOS + 1)
    assert other_eos.template is not first.template and other_eos.allowed([5, 6]) == (EOS + 1, 7)
    assert MultipleChoiceProcessor(CHOICES[:3], EOS).allowed([5, 6]) == (7,)  # another set: its own trie


def test_a_step_allocates_nothing_vocab_sized() -> None:
    vocab = 100_000
    p = choice_processor()
    row = torch.zeros(vocab)
    p([5], row)  # the first call builds the node's small index tensor
    assert largest_allocation(lambda: p([5], row)) < 4096


def test_a_request_whose_output_left_every_choice_is_fail_stopped_and_reported() -> None:
    reports: list[str] = []
    request = sdk.realize([{"kind": "multiple_choice", "choices": [[5, 6]], "eos_token_id": EOS}], vocab_size=V,
                          stop_token_id=EOS, report=reports.append)
    assert request is not None
    logits = torch.randn(2, V)
    logits[0, 6] = float("-inf")  # the engine's grammar masks the choice's next token
    sdk.apply_rows(logits, [0], [request], [[5]])
    assert request.failed and finite(logits[0]) == [EOS]
    assert len(reports) == 1 and "no token left to sample at output position 1" in reports[0]


@pytest.mark.parametrize(("host_histories", "token_window", "resident"), [(True, False, True), (False, True, True),
                                                                        (False, False, False)])
def test_a_multiple_choice_request_is_resident_where_the_rows_histories_or_tokens_are_read(
        host_histories: bool, token_window: bool, resident: bool) -> None:
    """Decided on the host from the histories (vLLM's V1 runner) or on the device from each row's
    first tokens (Model Runner V2's ``TokenWindow``); with neither it stays on the host path."""
    from dynlogits.sdk.resident.slot_batch import SlotBatch

    request = realize([{"kind": "multiple_choice", "choices": [[5]], "eos_token_id": EOS}])
    assert request.resident  # it has a template
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=host_histories, token_window=token_window)
    assert batch.assign(0, request) == resident


def test_the_resident_path_equals_the_host_path_step_by_step() -> None:
    """With host histories (vLLM's V1 runner); the last history left every choice: no token, on both."""
    payload = [{"kind": "multiple_choice", "choices": [list(c) for c in CHOICES], "eos_token_id": EOS}]
    histories = [[], [5], [5, 6], [5, 6, 7], [5, 6, 7, EOS], [5, 6, 7, EOS, 3], [5, 8], [9], [9, EOS], [5, 9]]
    for resident, host in resident_and_host(payload, histories):
        assert torch.equal(resident, host)


def test_resident_rows_of_several_requests_keep_what_their_own_processors_allow() -> None:
    """One step over many rows with host histories, choice sets of several sizes: each row keeps its
    processor's ids; a row that left its choices keeps none (its request is failed)."""
    import random

    import numpy as np

    from dynlogits.sdk.resident.slot_batch import SlotBatch

    rng = random.Random(3)
    batch = SlotBatch(num_slots=8, vocab_size=V, device="cpu", host_histories=True)
    processors, histories, requests = [], [], []
    for slot in range(8):
        choices = [[rng.choice([EOS, 2, 3, 4]) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 5))]
        choices = [c if c[0] != EOS else [2, *c] for c in choices]
        request = realize([{"kind": "multiple_choice", "choices": choices, "eos_token_id": EOS}])
        assert batch.assign(slot, request)
        requests.append(request)
        processors.append(MultipleChoiceProcessor(choices, EOS))
        history = [] if slot % 4 == 0 else list(rng.choice(choices)[: rng.randint(1, 4)])
        histories.append(history + ([9] if slot == 5 else []))  # slot 5 left its choices
    batch.flush()
    batch.set_rows(np.array([3, 0, 7, 1, 6, 2, 5, 4]))  # rows in another order than slots
    logits = torch.randn(8, V)
    row_histories = [histories[s] for s in (3, 0, 7, 1, 6, 2, 5, 4)]
    batch.apply(logits, EngineStep(histories=row_histories))
    for row, slot in enumerate((3, 0, 7, 1, 6, 2, 5, 4)):
        want = list(processors[slot].allowed(row_histories[row]))
        assert finite(logits[row]) == (want or [EOS]), (slot, row_histories[row])
    assert [r.failed for r in requests] == [slot == 5 for slot in range(8)]


def test_the_template_lists_every_edge_of_the_trie_and_each_whole_choice_then_eos() -> None:
    t = choice_processor().template
    got = sorted(zip(t.prefixes, t.ids, t.at_least))
    assert got == sorted([((), 5, False), ((), 9, False), ((5,), 6, False), ((5,), 8, False), ((5, 6), EOS, False),
                          ((5, 6), 7, False), ((5, 6, 7), EOS, False), ((5, 8), EOS, False), ((9,), EOS, False),
                          ((5, 6, EOS), EOS, True), ((5, 6, 7, EOS), EOS, True), ((5, 8, EOS), EOS, True),
                          ((9, EOS), EOS, True)])
    assert t.geometry == (13, 4)
