"""``trigger`` and ``thinking_budget`` under Model Runner V2, in the CUDA model: a step follows each
table's span over all its rounds and decides every slot in one fused ``spans_advance_``, and each
row's decision is read off it (with drafts before rows: one fused ``spans_drafts_`` instead), so
the kinds' own device work (``DeviceThinking.step`` and ``decide``) is a fixed number of launches
whatever the rounds (one, a speculative config's three, a resumed request's catch-up) and drafts,
with no sync, and decides as the eager path does on the CPU. A steady Model Runner V2 step of either
kind, forcing and settling its rows in one more fused op where no later group masks them, is at most
8 launches (issue 49's bound per kind)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.slots import GatheredRows
from dynlogits.testing.cuda.drive import Scenario, drive_v2
from dynlogits.testing.cuda.simcuda import SimCuda

V, SLOTS, PROMPT = 64, 4, 2
#: a steady step's launches of the span kinds' own work: the fused advance and decision (1), each
#: row's decision read off it (``index``, ``where``)
SPAN_LAUNCHES = 3
#: with drafts: the fused advance, then every row's state over its drafts and its decision (1 each)
DRAFT_LAUNCHES = 2
#: what the first step after arrivals adds: their prompt lengths lifted into the state (``mul``,
#: ``addcmul_``) and a copy per arrived slot (the flags of slots to lift, reset)
LIFT = 2 + SLOTS - 1

PAYLOADS: dict[str, list[dict[str, Any]]] = {
    "trigger": [{"kind": "trigger", "trigger_token_ids": [11], "phrase_token_ids": [12, 13]}],
    "thinking_budget": [{"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21], "budget": 2}],
    "thinking_budget-two-token-end": [{"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21, 22],
                                      "budget": 2}],
}
#: per slot its generated tokens: the trigger fired, a span that a one-token end closed (a two-token
#: one begun), a span open past its budget, and an idle slot
OUTPUTS = [[11, 5], [20, 5, 6, 21], [20, 5, 6, 7], []]


def _steps(kind: str, max_new: int, first: bool, device: torch.device, sim: SimCuda | None,
           drafts: bool = False) -> tuple[list[int], list[str]]:
    """Requests resumed with ``OUTPUTS`` (caught up on the device at their first step), then a
    steady step (``drafts``: slot 2's request with two drafts, slot 0's with one, the second a
    placeholder): the decisions per row of the first step (``first``) or of the steady one, and its
    ops (``sim``'s; none on the CPU)."""
    put = (lambda t: t) if sim is None else sim.put
    thinking = DeviceThinking(SLOTS + 1, device, max_new=max_new)
    for slot in range(SLOTS - 1):
        request = sdk.realize(PAYLOADS[kind], vocab_size=V, stop_token_id=1)
        assert request is not None
        thinking.assign(slot, request, resumed=len(OUTPUTS[slot]))
    thinking.flush()
    matrix = torch.zeros(SLOTS, 16, dtype=torch.int32)
    for slot, output in enumerate(OUTPUTS):
        matrix[slot, PROMPT : PROMPT + len(output)] = torch.tensor(output, dtype=torch.int32)
    tokens = put(matrix)
    prompt_len = put(torch.full((SLOTS,), PROMPT, dtype=torch.int32))
    total_len = put(torch.tensor([PROMPT + len(o) for o in OUTPUTS], dtype=torch.int32))
    ((level, group_type),) = thinking.tables
    group = group_type(level, SLOTS + 1, torch.device("cpu"))
    input_ids = local_pos = None
    if drafts:
        rows = GatheredRows(put(torch.tensor([2, 2, 2, 0, 0, 1, 3])), put(torch.tensor([True] * 6 + [False])))
        input_ids = put(torch.tensor([7, 21, 22, 5, -1, 21, 0], dtype=torch.int32))
        local_pos = put(torch.tensor([0, 1, 2, 0, 1, 0, 0], dtype=torch.int32))
    else:
        rows = GatheredRows(put(torch.tensor([2, 0, 1, 3])), put(torch.tensor([True, True, True, False])))
    for _ in range(1 if first else 2):
        before = 0 if sim is None else len(sim.ops)
        thinking.step(tokens, prompt_len, total_len, input_ids=input_ids, local_pos=local_pos)
        decided = thinking.decide(group, rows)
    ops = [] if sim is None else sim.ops[before:]
    values = decided if sim is None else sim.value(decided)
    return [int(v) for v in values], ops


@pytest.mark.parametrize(("max_new", "first"), [(1, False), (3, False), (1, True)],
                         ids=["one-round", "speculative", "catch-up"])
@pytest.mark.parametrize("kind", list(PAYLOADS))
def test_a_step_follows_and_decides_a_span_kind_in_a_fixed_number_of_launches(kind: str, max_new: int,
                                                                              first: bool) -> None:
    with SimCuda() as sim:
        decided, ops = _steps(kind, max_new, first, sim.device, sim)
        syncs = len(sim.syncs)
    assert syncs == 0
    assert len(ops) == SPAN_LAUNCHES + (LIFT if first else 0) and ops.count("spans_advance_") == 1, ops
    assert "addcmul" not in ops  # no eager round
    eager, _ = _steps(kind, max_new, first, torch.device("cpu"), None)
    assert decided == eager and decided[3] == -1  # the non-member row decides nothing
    assert any(d >= 0 for d in decided) and any(d < 0 for d in decided[:3])


@pytest.mark.parametrize("kind", list(PAYLOADS))
def test_a_step_with_drafts_follows_and_decides_a_span_kind_in_two_launches(kind: str) -> None:
    with SimCuda() as sim:
        decided, ops = _steps(kind, 3, False, sim.device, sim, drafts=True)
        syncs = len(sim.syncs)
    assert syncs == 0 and ops == ["spans_advance_", "spans_drafts_"] and len(ops) == DRAFT_LAUNCHES
    eager, _ = _steps(kind, 3, False, torch.device("cpu"), None, drafts=True)
    assert decided == eager and decided[4] == decided[6] == -1  # after a placeholder; not a member
    assert any(d >= 0 for d in decided)


#: a steady Model Runner V2 step of one span kind: at most this many launches
V2_BOUND = 8
#: the span kinds' steady step: the fused advance, the positions (``trigger`` reports them), the
#: rows' decisions read off it, the forcing and settle (``decided_settle_``) and its flags' copy
V2_STEADY = {"trigger": ["spans_advance_", "sub", "index", "where", "decided_settle_", "copy_"],
             "thinking_budget": ["spans_advance_", "index", "where", "decided_settle_", "copy_"]}


@pytest.mark.parametrize("kind", list(PAYLOADS))
def test_a_steady_model_runner_v2_step_of_a_span_kind_is_at_most_eight_launches(kind: str) -> None:
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=[PAYLOADS[kind]] * 4, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == V2_STEADY[kind.split("-")[0]] and steady.launches <= V2_BOUND


def test_a_span_kind_masked_after_it_settles_after_every_group() -> None:
    """A later entry that can mask the rows (banned tokens): the forcing leaves the rows to be
    settled after every group (no fused settle), still with no sync."""
    payload = [*PAYLOADS["trigger"], {"kind": "banned_tokens", "token_ids": [30]}]
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=[payload] * 2, steps=4, changes=False))
    assert [str(s) for s in steady.syncs] == [] and "decided_settle_" not in steady.steady_ops
    assert "dead_rows_" in steady.steady_ops  # settled by record_dead (its fused epilogue)


#: a steady step with 2 drafts a request: the fused advance, the adapter's row mapping under drafts
#: (``_to_copy``, ``eq``, ``index``; ``trigger`` its positions too), the drafts' decisions
#: (``spans_drafts_``), the forcing and settle with the real-row mask (``decided_settle_``: a dead row
#: after a draft stopped, not flagged) and its flags' copy
V2_DRAFTED = {"trigger": ["spans_advance_", "_to_copy", "eq", "index", "_to_copy", "sub", "sub", "index",
                          "spans_drafts_", "decided_settle_", "copy_"],
              "thinking_budget": ["spans_advance_", "_to_copy", "eq", "index", "spans_drafts_", "decided_settle_",
                                  "copy_"]}


@pytest.mark.parametrize("kind", ["trigger", "thinking_budget"])
def test_under_drafts_a_span_kinds_forcing_is_the_one_fused_settle(kind: str) -> None:
    """2 drafts a request: the forcing and settle are one fused op under drafts too (was 10 eager ops
    and the epilogue's 2: trigger 21 ops, thinking_budget 17); no sync."""
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(payloads=[PAYLOADS[kind]] * 4, steps=7, changes=False), drafts=2)
    assert [str(s) for s in steady.syncs] == [] and not steady.failures
    assert steady.steady_ops == V2_DRAFTED[kind]
