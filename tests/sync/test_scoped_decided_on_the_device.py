"""A scoped ``no_repeat_ngram`` or ``banned_phrases`` (decided kinds that opt in:
``DecidedGroup.scopable``, ``WindowDecided.floored``) is resident on both vLLM runners (``scope.ScopedDecided``): on the
V1 runner every member row is decided on the host from its phase's stretch of its live list (a
row out of its phase from the empty history: nothing), under Model Runner V2 from the engine's
token matrix in place, no position before its floor counted (``scope.FloorScopeTables``: its
stretch's start, past every position for a row out of its phase), by the kind's fused op. Neither
waits for the device (the CUDA model), with drafts or without. (Rows against the hosted path:
``tests/processors/test_scoped_decided.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected


def _scoped_ngram(i: int) -> list[dict[str, Any]]:
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]},
            {"kind": "no_repeat_ngram", "size": 1 + i % 3, "scope": ["reasoning", "answer"][i % 2]},
            {"kind": "banned_tokens", "token_ids": [9], "scope": "answer"}]


PAYLOADS = [_scoped_ngram(i) for i in range(4)]


def _scoped_phrases(i: int) -> list[dict[str, Any]]:
    """Phrases of 1 to 3 tokens, one whose prefix holds the end delimiter (crossing the answer's start)."""
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7, 8][: 1 + i % 2]},
            {"kind": "banned_phrases", "phrases": [[3, 4, 10 + i], [7, 3, 20], [11 + i]][: 2 + i % 2],
             "scope": ["reasoning", "answer"][i % 2]},
            {"kind": "banned_tokens", "token_ids": [9], "scope": "answer"}]


PHRASES = [_scoped_phrases(i) for i in range(4)]


#: per kind: scoped requests of it (beside a scoped ``banned_tokens``) and its fused op
KINDS = {"no_repeat_ngram": (PAYLOADS, "no_repeat_ngram_ban_"), "banned_phrases": (PHRASES, "banned_phrases_ban_")}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_decided_requests_never_wait_through_batch_changes(drive, kind: str) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=KINDS[kind][0], steps=12))
    assert [str(s) for s in result.syncs] == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_scoped_decided_requests_never_wait_under_drafts(kind: str) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=KINDS[kind][0], steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_v2_steady_step_decides_each_rows_floor_then_masks_with_the_kinds_fused_op(kind: str) -> None:
    """Model Runner V2, no drafts: the span followed once and each slot's floor decided in it
    (``spans_advance_``, ``FLOOR``), each row's off it (``index``, ``where``; was ``index``,
    ``logical_and``, ``where``), then the kind's one fused op over the engine's matrix with the
    floors: no copy of the rows' tokens, nothing per row."""
    payloads, op = KINDS[kind]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[p[:2] for p in payloads], steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == ["spans_advance_", "index", "where", op]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("drafts", [0, 2])
def test_the_v2_steady_step_of_a_scoped_decided_kind_is_at_most_eight_launches(drafts: int, kind: str) -> None:
    """Issue 49's bound: a steady Model Runner V2 step of scoped requests of one kind alone (the
    adapter's row mapping included) launches at most 8 device ops, with 2 drafts a request too,
    and waits for nothing."""
    payloads, op = KINDS[kind]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=[p[:2] for p in payloads], steps=6, changes=False),
                          drafts=drafts)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops.count(op) == 1
    assert steady.launches <= 8, steady.steady_ops
