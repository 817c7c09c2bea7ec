"""A scoped ``dry`` (a decided kind that opts in: ``DryGroup.scopable``, ``floored``) is resident on
both vLLM runners (``scope.ScopedDecided``): on the V1 runner every member row is decided on the
host from its phase's stretch of its live list (a row out of its phase from the empty history:
nothing), under Model Runner V2 from the engine's token matrix in place, no position before its
floor counted (``scope.FloorScopeTables``: its stretch's start, past every position for a row out
of its phase), by the kind's fused op (``dry_lower_`` with a floor). Neither waits for the device
(the CUDA model), with drafts or without. (Rows against the hosted path:
``tests/processors/test_scoped_dry.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


def _scoped_dry(i: int) -> list[dict[str, Any]]:
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]},
            {"kind": "dry", "multiplier": 0.8, "allowed_length": 1 + i % 3, "penalty_last_n": [-1, 16][i % 2],
             "sequence_breakers": [], "scope": ["reasoning", "answer"][i % 2]},
            {"kind": "banned_tokens", "token_ids": [9], "scope": "answer"}]


PAYLOADS = [_scoped_dry(i) for i in range(4)]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_dry_requests_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12))
    assert [str(s) for s in result.syncs] == []


def test_scoped_dry_requests_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


def test_the_v2_steady_step_decides_each_rows_floor_then_lowers_with_the_kinds_fused_op() -> None:
    """Model Runner V2, no drafts: the span followed once and each slot's floor decided in it
    (``spans_advance_``, ``FLOOR``), each row's off it (``index``, ``where``), then the kind's one fused op over
    the engine's matrix (declared two launches: its kernel and a ``scatter_reduce_``): no copy of
    the rows' tokens, nothing per row."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[p[:2] for p in PAYLOADS], steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == ["spans_advance_", "index", "where", "dry_lower_", "dry_lower_"]


def test_the_v2_steady_step_of_a_scoped_dry_is_at_most_eight_launches() -> None:
    """Issue 49's bound: a steady Model Runner V2 step of scoped ``dry`` requests alone (the
    adapter's row mapping included) launches at most 8 device ops (``dry_lower_`` counts 2), and
    waits for nothing. (With 2 drafts a request it is 9: the drafts' span ops, 7, and the kind's 2.)"""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[p[:2] for p in PAYLOADS], steps=6, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops.count("dry_lower_") == 2  # one op, two launches
    assert steady.launches <= 8, steady.steady_ops
