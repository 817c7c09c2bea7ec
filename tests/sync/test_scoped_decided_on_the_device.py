"""A scoped ``no_repeat_ngram`` (a decided kind that opts in: ``DecidedGroup.scopable``,
``WindowDecided.scoped_reach``) is resident on both vLLM runners (``scope.ScopedDecided``): on the
V1 runner every member row is decided on the host from its phase's stretch of its live list (a
row out of its phase from the empty history: nothing), under Model Runner V2 from its last tokens
read on the device (``scope.TokensScopeTables``: the tokens before its stretch's start, and every
token of a row out of its phase, read as placeholders) and banned by the kind's fused op. Neither
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


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_no_repeat_ngram_requests_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12))
    assert [str(s) for s in result.syncs] == []


def test_scoped_no_repeat_ngram_requests_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=12), drafts=2)
    assert [str(s) for s in result.syncs] == []


def test_the_v2_steady_step_reads_each_rows_stretch_then_bans_with_the_kinds_fused_op() -> None:
    """Model Runner V2, no drafts: the span followed once (``spans_advance_``), each row's last
    tokens read (``index``) with those outside its stretch made placeholders, then the kind's one
    fused op; nothing per row, no ``arange``."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=64, payloads=PAYLOADS, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops.count("no_repeat_ngram_ban_") == 1 and ops.count("spans_advance_") == 2, ops
    assert "arange" not in ops
