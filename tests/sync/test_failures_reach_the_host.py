"""A request that fails on the device is reported whatever the engine calls next, on the CUDA model
(``dynlogits.testing.cuda.simcuda``: a copy lands only once the modelled device has caught up), for
every adapter, with no sync added; and each mechanism behind it is needed (its mutant is caught).

The sequence (``sync_drive.failure_then``): one request forcing a token the grammar masks, its
failing step the engine's last for it (it samples the stop token it was fail-stopped to and is
ended), the device catches up, then the engine applies empty batches, batches of hosted rows only,
makes bookkeeping calls only, or does nothing at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.sdk import readback
from dynlogits.sdk.resident import flags, slot_batch
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.testing.cuda.drive import AFTER, FAILING, GRAMMAR_MASKED, ROW_ENGINES, failure_then
from dynlogits.testing.cuda.simcuda import SimCuda

RUNNERS = ["v1", "v2", *sorted(ROW_ENGINES)]
EOS = 1


@pytest.fixture(autouse=True)
def _allow_python_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", "dynlogits.testing.faults:scale")


@contextmanager
def _no_watcher() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(readback.INBOX, "watching", False)
        yield


def _run(runner: str, after: str, settle_s: float = 10.0) -> tuple[list[str], list[str]]:
    with SimCuda() as sim:
        reports = failure_then(sim, runner, after, settle_s=settle_s)
    syncs = [str(s) for s in sim.syncs if "row_histories" not in s.where]  # V2's documented hosted read
    return reports, syncs


@pytest.mark.parametrize("after", AFTER)
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_failure_at_the_last_step_is_reported_once_whatever_follows(runner: str, after: str) -> None:
    reports, syncs = _run(runner, after)
    assert syncs == []
    assert len(reports) == 1 and "no token left to sample at output position 0" in reports[0], reports


@pytest.mark.parametrize("after", [a for a in AFTER if a != "idle"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_a_busy_engine_learns_it_from_its_own_next_calls(runner: str, after: str) -> None:
    """Without the watcher, the adapter's next calls of any kind read the landed flags."""
    with _no_watcher():
        reports, _ = _run(runner, after, settle_s=0.0)
    assert len(reports) == 1, reports


@pytest.mark.parametrize("runner", RUNNERS)
def test_mutant_without_the_watcher_never_reports_an_idle_engines_failure(runner: str) -> None:
    with _no_watcher():
        reports, _ = _run(runner, "idle", settle_s=0.0)
    assert reports == []


@pytest.mark.parametrize("runner", RUNNERS)
def test_mutant_that_reads_only_inside_apply_misses_the_failure(runner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's defect: flags read back only by a later apply with resident rows (or a later plan)."""
    monkeypatch.setattr(readback.INBOX, "drain", lambda: 0)
    with _no_watcher():
        reports, _ = _run(runner, "calls", settle_s=0.0)
    assert reports == []


@pytest.mark.parametrize("after", ["apply", "calls"])
def test_a_request_that_leaves_before_its_flag_lands_is_still_reported(after: str) -> None:
    """The host runs ahead (async scheduling): the request is removed, and its slot reset, before
    the device ran its failing step."""
    with _no_watcher(), SimCuda() as sim:
        reports = failure_then(sim, "v1", after, settle_s=0.0, lag=True)
    assert len(reports) == 1, reports


def test_mutant_that_attributes_a_flag_to_the_slots_occupant_at_read_time_misses_a_departed_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag names the request that held the slot when its copy was queued; read against the
    slot's occupant when the copy lands (the slot is empty by then), nothing is reported."""
    real = flags.SlotFlags.snapshot

    def snapshot(self: flags.SlotFlags, *args: Any) -> flags.FlagSnapshot:  # per-slot or per-row flags
        taken = real(self, *args)
        taken.owners = self.owners  # the live list: whoever holds each slot when it is read
        return taken

    monkeypatch.setattr(flags.SlotFlags, "snapshot", snapshot)
    with _no_watcher(), SimCuda() as sim:
        reports = failure_then(sim, "v1", "calls", settle_s=0.0, lag=True)
    assert reports == []


# -- a request flagged without ending, preempted and re-added before the flag is read --------------
def _masked_request(stop: int | None, reports: list[str]) -> sdk.GuardedRequest:
    request = sdk.realize(FAILING, vocab_size=64, stop_token_id=stop, report=reports.append)
    assert request is not None
    return request


def _step(sim: SimCuda, batch: sdk.SlotBatch, rows: int, history: list[int], masked: bool) -> torch.Tensor:
    logits = sim.put(torch.randn(rows, 64))
    if masked:
        with sim.paused():
            logits.elem[0, GRAMMAR_MASKED] = -math.inf  # type: ignore[attr-defined]
    sdk.drain()  # what the adapter does first in every call
    batch.apply(logits, EngineStep(histories=[history] * rows))
    return logits


def _preempted_then_readded(sim: SimCuda) -> tuple[torch.Tensor, list[str]]:
    """V1 bookkeeping on ``SlotBatch``: the request's row is left with no token (its stop token is
    ignored by the engine: vLLM's ``min_tokens``), it is preempted before the flag is read and
    re-added to another slot; the flag lands; the next step's row."""
    reports: list[str] = []
    batch = sdk.SlotBatch(num_slots=4, vocab_size=64, device=sim.device)
    request = _masked_request(EOS, reports)
    batch.assign(0, request)
    batch.set_rows(np.array([0]))
    batch.flush()
    _step(sim, batch, 1, [], masked=True)  # flagged and fail-stopped to EOS, which min_tokens ignores
    batch.assign(0, None)  # preempted before the device ran the step
    batch.assign(2, request)  # re-added to another slot, its program intact
    batch.set_rows(np.array([2]))
    batch.flush()
    sim.advance()  # the flag lands
    logits = _step(sim, batch, 1, [EOS], masked=False)
    return sim.value(logits)[0], reports


def test_a_request_flagged_preempted_and_readded_is_fail_stopped_in_its_new_slot() -> None:
    with _no_watcher(), SimCuda() as sim:
        row, reports = _preempted_then_readded(sim)
    assert torch.isfinite(row).nonzero().flatten().tolist() == [EOS]
    assert len(reports) == 1 and "no token left to sample at output position 0" in reports[0]


def test_mutant_that_fails_a_readded_request_without_stopping_its_slot_lets_it_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slot_batch.SlotBatch, "_stop_newly_failed", lambda self: None)
    with _no_watcher(), SimCuda() as sim:
        row, reports = _preempted_then_readded(sim)
    assert len(reports) == 1  # reported, yet its program still runs: the forced token, not the stop
    assert torch.isfinite(row).nonzero().flatten().tolist() == [6]
