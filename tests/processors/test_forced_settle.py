"""``forced_sequence`` settling its rows on the resident path, on the CPU: the host plans steps
ahead while every row generates one token per step (``ForcedSequenceGroup._plan_ahead``), and a
step whose forced logits are all kept takes the short way (``_settled_on_host``). Both must give
what the host path gives, step by step, whatever the counts do and whichever logits are masked."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.forced_sequence import ForcedSequenceGroup
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 48
EOS = 1
NEG = float("-inf")


def _payload(tokens: list[int]) -> list[dict]:
    return [{"kind": "forced_sequence", "token_ids": tokens, "eos_token_id": EOS}]


def _request(tokens: list[int], reports: list[str] | None = None) -> sdk.GuardedRequest:
    request = sdk.realize(_payload(tokens), vocab_size=V, stop_token_id=EOS,
                          report=reports.append if reports is not None else None)
    assert request is not None
    return request


def _sequences(rng: random.Random, n: int) -> list[list[int]]:
    return [[rng.randrange(2, V) for _ in range(rng.randrange(30, 60))] for _ in range(n)]


@pytest.mark.parametrize("rows", [3, 12])  # the plan in Python (few rows) and in numpy
def test_forced_rows_follow_their_counts_through_steady_steps_stalls_and_jumps(rows: int) -> None:
    """Counts that mostly grow by one (the steps planned ahead) but sometimes stall (chunked
    prefill) or jump (accepted drafts), over a layout with an empty row: every step equals the host
    path's, so no step is served a plan laid out for other counts."""
    rng = random.Random(rows)
    sequences = _sequences(rng, rows)
    batch = SlotBatch(num_slots=rows + 1, vocab_size=V, device="cpu")
    for slot, tokens in enumerate(sequences):
        batch.assign(slot, _request(tokens))
    host_slots = np.array([-1, *range(rows)])  # row 0 holds no request: member rows are not 0..n-1
    batch.set_rows(host_slots)
    hosted = [_request(tokens) for tokens in sequences]
    histories: list[list[int]] = [[] for _ in range(rows + 1)]
    for step in range(60):
        logits = torch.randn(rows + 1, V)
        want = logits.clone()
        batch.apply(logits, EngineStep(histories=histories))
        sdk.apply_rows(want, list(range(1, rows + 1)), hosted, histories[1:])
        assert torch.equal(logits, want), step
        for row in range(1, rows + 1):
            tokens = sequences[row - 1]
            count = len(histories[row])
            forced = tokens[count] if count < len(tokens) else EOS
            assert torch.isfinite(logits[row]).nonzero().flatten().tolist() == [forced], (step, row)
        for history in histories:
            grow = rng.choice([1, 1, 1, 1, 1, 0, 2]) if step % 11 > 6 else 1
            history.extend([EOS] * grow)
    assert not any(request.failed for request in batch.requests if request is not None)


@pytest.mark.parametrize("source", ["histories", "pos"])  # the V1 runner's plan, Model Runner V2's positions
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_forced_logit_masked_mid_run_fails_that_row_at_that_step_only(dtype: torch.dtype, source: str) -> None:
    """Steady steps where every forced logit is kept, then one step where one row's is ``-inf``
    (the model's own mask): that row is fail-stopped to its stop token and reported once at its
    position; the other rows are forced as before, at that step and after."""
    sequences = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19, 20, 21, 22]]
    reports: list[str] = []
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
    requests = [_request(tokens, reports) for tokens in sequences]
    for slot, request in enumerate(requests):
        batch.assign(slot, request)
    batch.set_rows(np.array([0, 1, 2]))
    histories: list[list[int]] = [[], [], []]
    offset = torch.tensor([7, 20, 3])  # each row's prompt length: ``pos - offset`` tokens generated
    for step in range(6):
        logits = torch.randn(3, V).to(dtype)
        if step == 3:
            logits[1, sequences[1][step]] = NEG
        if source == "histories":
            batch.apply(logits, EngineStep(histories=histories))
        else:
            batch.apply(logits, EngineStep(pos=offset + step, pos_offset=offset))
        for row, tokens in enumerate(sequences):
            finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
            if row == 1 and step >= 3:
                assert finite == [EOS], step  # fail-stopped from the masked step on
            else:
                assert finite == [tokens[step]] and logits[row, tokens[step]].item() == 0.0, (step, row)
        for history in histories:
            history.append(EOS)
    assert [r.failed for r in requests] == [False, True, False]
    assert len(reports) == 1 and "at output position 3:" in reports[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_non_finite_logits_never_beat_the_forced_token(dtype: torch.dtype) -> None:
    """A NaN or ``+inf`` at the forced id is kept as 0.0 (it is not masked); NaN and ``+inf``
    elsewhere in the row are masked like any other id."""
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu")
    requests = [_request([5, 6]), _request([7, 8])]
    for slot, request in enumerate(requests):
        batch.assign(slot, request)
    batch.set_rows(np.array([0, 1]))
    logits = torch.randn(2, V).to(dtype)
    logits[0, 5], logits[0, 9] = float("nan"), float("inf")
    logits[1, 7], logits[1, 3] = float("inf"), float("nan")
    batch.apply(logits, EngineStep(histories=[[], []]))
    for row, forced in enumerate([5, 7]):
        want = torch.full((V,), NEG, dtype=dtype)
        want[forced] = 0.0
        assert torch.equal(logits[row], want), row
    assert not any(r.failed for r in requests)


def test_the_plan_laid_out_ahead_is_what_the_step_would_plan() -> None:
    """Over a steady run, ``plan``'s values served from the steps laid out ahead equal those
    planned from the counts alone (a group whose plan-ahead is switched off)."""
    rng = random.Random(7)
    sequences = _sequences(rng, 10)
    planned: dict[bool, list[list[int]]] = {True: [], False: []}
    for ahead in (True, False):
        batch = SlotBatch(num_slots=11, vocab_size=V, device="cpu")
        for slot, tokens in enumerate(sequences):
            batch.assign(slot, _request(tokens))
        batch.set_rows(np.array([*range(10)]))
        group = next(iter(batch.groups.values()))
        assert isinstance(group, ForcedSequenceGroup)
        if not ahead:
            group._AHEAD = 0  # every step planned from its counts
        real = group.plan

        def spy(rows, counts, generated, out, real=real, into=planned[ahead]):  # noqa: ANN001
            real(rows, counts, generated, out)
            into.append(out.tolist())

        group.plan = spy  # type: ignore[method-assign]
        histories: list[list[int]] = [[] for _ in range(10)]
        for _ in range(40):
            batch.apply(torch.randn(10, V), EngineStep(histories=histories))
            for history in histories:
                history.append(EOS)
    assert planned[True] == planned[False] and len(planned[True]) == 40
