"""``multiple_choice`` on the CUDA model (``dynlogits.testing.cuda``), driven as vLLM drives the
adapter: under Model Runner V2 each row's first generated tokens are read and compared with its
slot's choices on the device by one fused op (``MultipleChoiceGroup``: ``dynlogits::multiple_choice_keep_``,
one launch on CUDA), then the restrictive groups' epilogue (the fused dead_rows_ and the flags' copy
back), no read back; on the V1 runner each row's processor decides on the host and the rows' allowed
ids go up in one upload. No step of a sequence with batch changes and a failing request waits for
the device. A scoped entry (``scope.ScopedDecided``): each row's floor off its span state, then the
same fused op from the floor on."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.testing.cuda.drive import EOS, Scenario, drive_v1, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

pytestmark = pytest.mark.usefixtures("quiet")  # the sequences' failing requests are expected

CHOICES = [[{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": EOS}],
           [{"kind": "multiple_choice", "choices": [[9, 9, 9]], "eos_token_id": EOS}]]
#: the steady step's own device ops: the rows' generated counts (``sub``, ``StepInputs.generated``:
#: a row left with no token reports its position) and the fused op (the rows' first generated tokens
#: read from the engine's matrix, compared with every entry of their slots, each member row kept at
#: the ids of the entries it matches; the tables read as they are, no per-layout gather)
V2_STEADY_OWN = ["sub", "multiple_choice_keep_"]
#: then what every restrictive group ends with (the rows left with no token, their flags: ``slots.py``)
V2_STEADY_EPILOGUE = 2


def test_vllm_model_runner_v2_choice_step_is_a_fixed_number_of_device_ops_and_reads_nothing_back() -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=CHOICES, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops[:len(V2_STEADY_OWN)] == V2_STEADY_OWN
    assert len(steady.steady_ops) == len(V2_STEADY_OWN) + V2_STEADY_EPILOGUE


#: the drafted steady step's (2 drafts a request) own device ops, after the adapter's row mapping (the
#: rows' slots, which follow committed tokens, their generated counts: 6 ops): the rows' membership
#: (``index``: the rows are gathered anew each step), each row's prompt length, the fused op's base
#: (``clamp``: the engine's slots, ``index``), its slot's ids (``index``: the witness of a row left
#: with none), then the fused op, reading the drafts fed before each row from ``input_ids``
V2_DRAFTED_OWN = ["index", "clamp", "index", "index", "multiple_choice_keep_"]
#: the adapter's row mapping under drafts (``adapters/vllm/v2.py``)
V2_DRAFTED_ADAPTER = 6


def test_vllm_model_runner_v2_drafted_choice_step_is_the_same_fused_op_and_reads_nothing_back() -> None:
    """Under speculative decoding (2 drafts a request) the steady step is the one fused op too (was
    68 ops cell by cell): 7 of the kind's own beside the adapter's row mapping."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=CHOICES, steps=7, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops.count("multiple_choice_keep_") == 1, ops
    assert ops[V2_DRAFTED_ADAPTER:V2_DRAFTED_ADAPTER + len(V2_DRAFTED_OWN)] == V2_DRAFTED_OWN, ops
    assert len(ops) == V2_DRAFTED_ADAPTER + len(V2_DRAFTED_OWN) + V2_STEADY_EPILOGUE, ops


@pytest.mark.parametrize("drafts", [0, 2])
def test_vllm_model_runner_v2_choice_sequence_never_waits_and_reports_the_failures(drafts: int) -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=CHOICES, steps=9), drafts=drafts)
    assert [str(s) for s in result.syncs] == []
    assert any("no token left to sample" in f for f in result.failures)


def test_vllm_v1_runner_choice_step_is_one_upload_and_a_keep_and_sequences_never_wait() -> None:
    with SimCuda() as sim:
        steady = drive_v1(sim, Scenario(payloads=CHOICES, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    # the rows' positions and their allowed ids go up (two uploads), then the keep: read, fill the rows, write back
    assert steady.steady_ops[:5] == ["copy_", "copy_", "index_select", "index_fill_", "index_copy_"]
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(payloads=CHOICES, steps=9))
    assert [str(s) for s in result.syncs] == []
    assert sum("no token left to sample" in f for f in result.failures) == 2


SCOPED: list[list[dict[str, Any]]] = [[{"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]},
           {"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": EOS, "scope": "answer"}],
          [{"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21, 22]},
           {"kind": "multiple_choice", "choices": [[9, 9, 9]], "eos_token_id": EOS, "scope": "reasoning"}]]


@pytest.mark.parametrize("drive", [drive_v1, drive_v2], ids=["v1", "v2"])
def test_scoped_choice_sequences_never_wait_through_batch_changes(drive) -> None:  # noqa: ANN001
    with SimCuda() as sim:
        result = drive(sim, Scenario(payloads=SCOPED, steps=9))
    assert [str(s) for s in result.syncs] == []


def test_scoped_choice_sequences_never_wait_under_drafts() -> None:
    with SimCuda() as sim:
        result = drive_v2(sim, Scenario(payloads=SCOPED, steps=9), drafts=2)
    assert [str(s) for s in result.syncs] == []


def test_the_v2_steady_step_of_a_scoped_choice_reads_each_rows_floor_then_runs_the_fused_op() -> None:
    """The span advanced once and each slot's floor decided in it (``spans_advance_``, ``FLOOR``:
    already at least the prompt's length), each row's off it (``index``, ``where``), the rows in
    phase (``lt``: what the epilogue may count dead; a floor below ``NEVER`` is a member's), the
    fused op with the floors as its bases: 8 ops with the harness's ``sub`` and the epilogue (was
    11: ``logical_and``, ``maximum``, ``bitwise_and``); no read back."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=SCOPED, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops[:6] == ["spans_advance_", "sub", "index", "where", "lt", "multiple_choice_keep_"]
    assert len(steady.steady_ops) == 6 + V2_STEADY_EPILOGUE


def test_the_v2_drafted_steady_step_of_a_scoped_choice_runs_the_fused_op_once() -> None:
    """With 2 drafts a request: the span advanced and its drafts followed, each row's floor
    decided in the drafts' op (``spans_drafts_``, ``FLOOR``), the slots' ids (``index``), the rows
    in phase (``lt``), the fused op once (was 72 ops cell by cell, then 20); no read back."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=SCOPED, steps=7, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    ops = steady.steady_ops
    assert ops.count("multiple_choice_keep_") == 1, ops
    assert ops[-6:] == ["spans_drafts_", "index", "lt", "multiple_choice_keep_", "dead_rows_", "copy_"], ops
    assert len(ops) == 14, ops
