"""``multiple_choice`` (docs/specs.md): the output is exactly one of the choices, then EOS."""

from __future__ import annotations

from typing import Any

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


def _window_case(seed: int, tokens_dtype: torch.dtype) -> tuple[Any, Any, Any, torch.Tensor, list[list[int] | None]]:
    """A random Model Runner V2 step of a ``MultipleChoiceGroup`` on the CPU: requests whose outputs
    follow a choice part of the way, to its end and EOS (then more), or leave it; prompts of 1 to 5
    tokens and a matrix as narrow as the longest (a row's head reaches past it); prefill chunks'
    rows (counted as the first), rows outside the group, the sentinel row; logits with NaNs. Per row
    the ids its processor allows (``None``: not a member)."""
    import random

    from dynlogits.processors.multiple_choice import MultipleChoiceGroup
    from dynlogits.processors.window import TokenWindow

    rng = random.Random(seed)
    requests = 1 + seed % 7
    length = 14
    tokens = torch.randint(2, 6, (requests, length), generator=torch.Generator().manual_seed(seed)).to(tokens_dtype)
    group = MultipleChoiceGroup(0, requests + 1, torch.device("cpu"))
    group.from_window = True
    prompt_len, pos, slot_of_row, wants = [], [], [], []
    for slot in range(requests):
        choices = [[rng.randrange(2, 6) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 4))]
        processor = MultipleChoiceProcessor(choices, EOS)
        member = slot == 0 or rng.random() < 0.8
        if member:
            group.assign(slot, processor.template)
        prompt = [rng.randrange(2, 6) for _ in range(rng.randint(1, 5))]
        choice = rng.choice(choices)
        output = choice[:rng.randint(0, len(choice))]
        if rng.random() < 0.3:
            output = choice + [EOS] * rng.randint(1, 2)
        if rng.random() < 0.2:
            output = output + [rng.randrange(2, 6)]  # may leave every choice
        committed = prompt + output
        tokens[slot, :len(committed)] = torch.tensor(committed, dtype=tokens_dtype)
        prompt_len.append(len(prompt))
        prefill = rng.random() < 0.15
        pos.append(rng.randrange(len(prompt)) if prefill else len(committed) - 1)
        slot_of_row.append(slot)
        wants.append(list(processor.allowed([] if prefill else output)) if member else None)
    pos.append(rng.randrange(length))  # the sentinel row
    slot_of_row.append(requests)
    wants.append(None)
    group.flush()
    positions = torch.tensor(pos, dtype=torch.int32 if seed % 2 else torch.int64)
    window = TokenWindow("cpu").at(tokens, torch.tensor(prompt_len, dtype=torch.int32), positions)
    logits = torch.randn(len(pos), V, generator=torch.Generator().manual_seed(seed))
    logits[torch.rand(len(pos), V, generator=torch.Generator().manual_seed(seed + 1)) < 0.05] = float("nan")
    return group, group.every_row(torch.tensor(slot_of_row)), window, logits, wants


def _bits(logits: torch.Tensor) -> torch.Tensor:
    """float32 ``logits`` as their bits (NaNs compared too)."""
    return logits.view(torch.int32)


def _previous_apply(logits: torch.Tensor, member: torch.Tensor, hit: torch.Tensor, ids: torch.Tensor) -> None:
    """The keep as it was written before (five device ops): the reference ``apply_device_decisions``
    must equal bit for bit."""
    kept = logits.gather(1, ids)
    logits.masked_fill_(member[:, None], float("-inf"))
    kept.masked_fill_(member[:, None] & ~hit, float("-inf"))
    logits.scatter_reduce_(1, ids, kept, reduce="amax")


@pytest.mark.parametrize("seed", range(40))
def test_the_window_decided_step_keeps_what_each_rows_processor_allows_by_count_or_cell_by_cell(seed: int) -> None:
    """Model Runner V2's step: int32 tokens take the counting decision (``_decide_by_count``), int64
    ones the cell-by-cell comparison; both keep, bit for bit, what the keep written before kept from
    the cell-by-cell decisions, each member row its processor's ids (none where its output left every
    choice), and leave the other rows as they were."""
    from dynlogits.processors.slots import StepInputs

    results = []
    for dtype in (torch.int32, torch.int64):
        group, rows, window, logits, wants = _window_case(seed, dtype)
        out = logits.clone()
        step = StepInputs(out, out.view(-1), V, None, torch.empty(0, dtype=torch.long))
        hit = group.decide_from_window(rows, window)
        dead = group.apply_device_decisions(step, rows, hit)
        results.append((out, hit, dead))
    (by_count, hit_count, dead), (by_cells, hit_cells, _) = results
    before = logits.clone()
    _previous_apply(before, rows.member, hit_cells, dead.witness)
    member = rows.member[:, None]
    assert torch.equal((hit_count & member), (hit_cells & member))  # a member row's decisions
    assert torch.equal(_bits(by_count), _bits(by_cells)) and torch.equal(_bits(by_count), _bits(before))
    assert dead.rows is None and torch.equal(dead.slots, rows.slot_of_row) and torch.equal(dead.where, rows.member)
    for row, want in enumerate(wants):
        if want is None:
            assert torch.equal(_bits(by_count[row]), _bits(logits[row])), row
        else:
            kept = (~torch.isneginf(by_count[row])).nonzero().flatten().tolist()
            assert kept == sorted(want), (seed, row)
