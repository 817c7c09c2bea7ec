"""The listed layout across batch changes: a group whose member rows, slots and tables stay keeps
what ``ListedLayout.prepare`` built for it; any change to them rebuilds it, and every step equals
the host path's."""

from __future__ import annotations

import random

import numpy as np
import torch

from dynlogits import sdk
from dynlogits.processors.forced_sequence import ForcedSequenceGroup
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.listed import _member_rows
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 48
EOS = 1


def _forced(tokens: list[int]) -> list[dict]:
    return [{"kind": "forced_sequence", "token_ids": tokens, "eos_token_id": EOS}]


def _banned(ids: list[int]) -> list[dict]:
    return [{"kind": "banned_tokens", "token_ids": ids}]


class _Run:
    """A ``SlotBatch`` and the same requests on the host path, stepped side by side."""

    def __init__(self, slots: int) -> None:
        self.batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
        self.payloads: dict[int, list[dict]] = {}
        self.host_slots = np.empty(0, dtype=np.int64)
        self.histories: list[list[int]] = []

    def assign(self, slot: int, payload: list[dict]) -> None:
        request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS)
        assert request is not None
        self.batch.assign(slot, request)
        self.payloads[slot] = payload

    def set_rows(self, host_slots: list[int], histories: list[list[int]]) -> None:
        self.host_slots = np.array(host_slots, dtype=np.int64)
        self.histories = histories
        self.batch.set_rows(self.host_slots)

    def step(self) -> None:
        logits = torch.randn(len(self.host_slots), V)
        want = logits.clone()
        self.batch.apply(logits, EngineStep(histories=self.histories))
        rows = [r for r, s in enumerate(self.host_slots.tolist()) if s >= 0]
        hosted = [sdk.realize(self.payloads[int(self.host_slots[r])], vocab_size=V, stop_token_id=EOS) for r in rows]
        sdk.apply_rows(want, rows, hosted, [self.histories[r] for r in rows])
        assert torch.equal(logits, want)
        for history in self.histories:
            history.append(EOS)

    def forced_rows(self):  # noqa: ANN201
        key = next(k for k in self.batch.groups if k[1] is ForcedSequenceGroup)
        return self.batch.listed.rows[key]


def _counting_prepares(monkeypatch) -> list[int]:  # noqa: ANN001
    calls: list[int] = []
    real = ForcedSequenceGroup.prepare

    def prepare(self, rows, stride):  # noqa: ANN001, ANN202
        calls.append(len(rows.rows))
        real(self, rows, stride)

    monkeypatch.setattr(ForcedSequenceGroup, "prepare", prepare)
    return calls


def _four_forced(monkeypatch, seed: int) -> tuple[random.Random, list[int], _Run]:  # noqa: ANN001
    """Forced-sequence requests of 20 random ids in slots 0..3 of an 8-slot run, prepares counted."""
    rng = random.Random(seed)
    calls = _counting_prepares(monkeypatch)
    run = _Run(slots=8)
    for slot in range(4):
        run.assign(slot, _forced([rng.randrange(2, V) for _ in range(20)]))
    return rng, calls, run


def test_a_batch_change_that_keeps_a_groups_rows_reuses_its_rows_and_tables(monkeypatch) -> None:  # noqa: ANN001
    _, calls, run = _four_forced(monkeypatch, 3)
    run.assign(4, _banned([3, 4]))
    run.set_rows([0, 1, 2, 3, 4], [[] for _ in range(5)])
    run.step()
    kept = run.forced_rows()
    run.step()
    # a banned_tokens request arrives in a new row, another replaces the one in slot 4
    run.assign(5, _banned([5]))
    run.assign(4, _banned([6, 7]))
    run.set_rows([0, 1, 2, 3, 4, 5], [*run.histories, [EOS]])
    for _ in range(3):
        run.step()
    assert run.forced_rows() is kept
    assert calls == [4]  # prepared once, at the first step


def test_a_batch_change_that_touches_a_groups_rows_or_tables_rebuilds_it(monkeypatch) -> None:  # noqa: ANN001
    rng, calls, run = _four_forced(monkeypatch, 4)
    run.set_rows([0, 1, 2, 3], [[] for _ in range(4)])
    run.step()
    run.assign(1, _forced([rng.randrange(2, V) for _ in range(20)]))  # same slot and row, another sequence
    run.step()
    h = run.histories
    run.set_rows([0, 2, 1, 3], [h[0], h[2], h[1], h[3]])  # two rows swap: same members, other rows
    run.step()
    run.assign(5, _banned([3]))  # another kind arrives in a new row: forced's rows are no longer every row
    run.set_rows([0, 2, 1, 3, 5], [*run.histories, []])
    run.step()
    run.batch.assign(2, None)  # a forced request leaves, its row is emptied
    run.set_rows([0, -1, 1, 3, 5], run.histories)
    run.step()
    assert calls == [4, 4, 4, 4, 3]


def test_member_rows_are_the_rows_whose_slot_is_a_member_in_order() -> None:
    rng = np.random.default_rng(5)
    sentinel = 40
    for _ in range(50):
        slot_of_row = rng.integers(0, sentinel + 1, size=rng.integers(0, 30))
        members = set(rng.choice(sentinel, size=rng.integers(1, 10), replace=False).tolist())
        want = np.flatnonzero(np.isin(slot_of_row, list(members)))
        assert np.array_equal(_member_rows(slot_of_row, members, sentinel), want)


def test_a_batch_change_that_keeps_the_groups_rows_keeps_its_plan(monkeypatch) -> None:  # noqa: ANN001
    """The plan laid out ahead (``ForcedSequenceGroup._plan_ahead``) is checked against the member
    rows' counts only: a request of another kind arriving in a new row neither breaks it nor
    restarts it, and every step still equals the host path's."""
    _, _, run = _four_forced(monkeypatch, 5)
    laid_out: list[int] = []
    real = ForcedSequenceGroup._plan_ahead

    def spy(self, rows, counts, generated):  # noqa: ANN001, ANN202
        laid_out.append(len(rows.rows))
        real(self, rows, counts, generated)

    monkeypatch.setattr(ForcedSequenceGroup, "_plan_ahead", spy)
    run.assign(4, _banned([3, 4]))
    run.set_rows([0, 1, 2, 3, 4], [[] for _ in range(5)])  # forced in rows 0..3, not every row
    for _ in range(7):  # laid out at steps 1, 3 and 6 (1, 2 then 4 steps ahead): 3 steps left
        run.step()
    assert laid_out == [4, 4, 4]
    run.assign(5, _banned([5]))  # another kind arrives in a new row, its count unlike any forced row's
    run.set_rows([0, 1, 2, 3, 4, 5], [*run.histories, [EOS] * 9])
    for _ in range(3):
        run.step()
    assert laid_out == [4, 4, 4]  # the three steps served from the plan laid out before the change
    run.step()
    assert laid_out == [4, 4, 4, 4]


def test_a_groups_generation_moves_with_each_flush_that_changes_it_and_only_then() -> None:
    """``Group.generation``, what ``ListedLayout`` keeps a group's layout by: a flush after an
    arrival, a change of the same slot's data or a departure bumps it once; a flush with nothing
    staged, or staging only another group's slot, leaves it."""
    run = _Run(slots=8)
    run.assign(0, _forced([5, 6, 7]))
    run.batch.flush()
    group = next(g for k, g in run.batch.groups.items() if k[1] is ForcedSequenceGroup)
    seen = [group.generation]
    run.batch.flush()  # nothing staged
    seen.append(group.generation)
    run.assign(1, _banned([3]))  # another kind's group
    run.batch.flush()
    seen.append(group.generation)
    run.assign(1, _forced([8, 9]))  # a forced request arrives
    run.batch.flush()
    seen.append(group.generation)
    run.assign(0, _forced([10, 11, 12]))  # another sequence in the same slot
    run.batch.flush()
    seen.append(group.generation)
    run.batch.assign(0, None)  # a forced request leaves
    run.batch.flush()
    seen.append(group.generation)
    start = seen[0]
    assert seen == [start, start, start, start + 1, start + 2, start + 3]
