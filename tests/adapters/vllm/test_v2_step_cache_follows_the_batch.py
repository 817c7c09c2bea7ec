"""Under Model Runner V2 the adapter keeps what a step's slots hold (``v2.SeenSlots``) and the
listed step's engine input from step to step: kept while the runner's ``idx_mapping_np`` holds the
same slots (same dtype, same values), dropped when the slots change order, when a request leaves
and another takes its slot, and when a preempted request resumes. Driven through
``V2SamplerHarness`` (vLLM's real ``LogitsProcRequestState``/``LogitsContext``; a new
``idx_mapping_np`` array every step, as ``GPUModelRunner.gather_batch_req_state`` builds it)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from pydantic import BaseModel, ConfigDict  # noqa: E402
from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.specs import WIRE_KEY, kinds  # noqa: E402
from dynlogits.specs.kinds import ProcessorKind  # noqa: E402

VOCAB = 64
EOS = 1
NEG = float("-inf")

CALLS: list[list[int]] = []


class TouchSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["test_touch"] = "test_touch"


class _Touch:
    """A hosted plug-in entry: records each history it sees."""

    def __call__(self, input_ids: Any, logits: torch.Tensor) -> None:
        CALLS.append(list(input_ids))


TOUCH_KIND = ProcessorKind("test_touch", TouchSpec, lambda entry, ctx: _Touch())


@pytest.fixture(autouse=True)
def touch_kind_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kinds, "_registered", {**kinds._registered, TOUCH_KIND.kind: TOUCH_KIND})
    CALLS.clear()


def sp(payload: list[dict[str, Any]] | None = None) -> SamplingParams:
    params = SamplingParams(temperature=0.0, extra_args=None if payload is None else {WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def banned(*ids: int) -> list[dict[str, Any]]:
    return [{"kind": "banned_tokens", "token_ids": list(ids)}]


def masked(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row == NEG).flatten().tolist())


def test_the_same_slots_in_another_order_move_each_requests_mask_with_its_row() -> None:
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4)
    harness.add_request("a", [2], sp(banned(10, 11)))
    harness.add_request("b", [2], sp(banned(20)))
    for order in (["a", "b"], ["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]):
        logits = harness.step(order, torch.zeros(2, VOCAB))
        want = {"a": {10, 11}, "b": {20}}
        assert [masked(logits[i]) for i in range(2)] == [want[r] for r in order]


def test_slots_with_the_same_bytes_in_another_dtype_are_another_layout() -> None:
    """int32 ``[1, 0]`` and int64 ``[1]`` are the same bytes: the second step is one row, slot 1's."""
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=2)
    assert harness.add_request("a", [2], sp(banned(10))) == 1
    assert harness.add_request("b", [2], sp(banned(20))) == 0
    ctx = harness.context(["a", "b"], {})
    assert ctx.idx_mapping_np.dtype == np.int32
    logits = harness.processor.apply(torch.zeros(2, VOCAB), ctx)
    assert [masked(logits[0]), masked(logits[1])] == [{10}, {20}]

    one = harness.context(["a"], {})
    one = dataclasses.replace(one, idx_mapping_np=one.idx_mapping_np.astype(np.int64))
    assert one.idx_mapping_np.tobytes() == ctx.idx_mapping_np.tobytes()
    logits = harness.processor.apply(torch.zeros(1, VOCAB), one)
    assert masked(logits[0]) == {10}


def test_a_request_that_takes_a_finished_requests_slot_is_run_as_its_own() -> None:
    """The same slots array before and after: the new occupant (hosted, then resident) is what runs."""
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=1)
    harness.add_request("first", [2], sp(banned(10)))
    assert masked(harness.step(["first"], torch.zeros(1, VOCAB))[0]) == {10}
    harness.remove_request("first")

    harness.add_request("hosted", [2], sp([{"kind": "test_touch"}]), output_ids=[7])
    logits = harness.step(["hosted"], torch.zeros(1, VOCAB))
    assert CALLS == [[7]] and masked(logits[0]) == set()
    harness.remove_request("hosted")

    harness.add_request("third", [2], sp(banned(30)))
    assert masked(harness.step(["third"], torch.zeros(1, VOCAB))[0]) == {30}


def test_a_positional_request_in_a_slot_a_plain_mask_left_gets_its_positions() -> None:
    """A step with no positional entry passes no positions; once a forced sequence takes the slot
    (a new occupant, then the same request resumed after preemption) its positions are passed."""
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=1)
    harness.add_request("mask", [2], sp(banned(10)))
    harness.greedy_step(["mask"])
    harness.remove_request("mask")

    forced = [{"kind": "forced_sequence", "token_ids": [30, 31, 32, 33], "eos_token_id": EOS}]
    harness.add_request("forced", [2, 3], sp(forced))
    assert harness.greedy_step(["forced"]) == {"forced": 30}
    assert harness.greedy_step(["forced"]) == {"forced": 31}
    output = harness.output_ids("forced")
    harness.remove_request("forced")  # preempted: V2 re-adds it with its output in the prefill

    harness.add_request("forced", [2, 3], sp(forced), output_ids=output)
    assert harness.greedy_step(["forced"]) == {"forced": 32}
    assert harness.greedy_step(["forced"]) == {"forced": 33}


def test_what_the_slots_hold_is_worked_out_once_while_the_same_slots_come_in_new_arrays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dynlogits.adapters.vllm import v2

    made: list[np.ndarray] = []
    of = v2.SeenSlots.of

    def counted(slots_in_step: np.ndarray, *flags: np.ndarray) -> v2.SeenSlots:
        made.append(slots_in_step.copy())
        return of(slots_in_step, *flags)

    monkeypatch.setattr(v2.SeenSlots, "of", staticmethod(counted))
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4)
    harness.add_request("a", [2], sp(banned(10)))
    harness.add_request("b", [2], sp(banned(20)))
    for _ in range(4):
        harness.step(["a", "b"], torch.zeros(2, VOCAB))  # a new idx_mapping_np each step
    harness.step(["b", "a"], torch.zeros(2, VOCAB))
    assert [m.tolist() for m in made] == [[3, 2], [2, 3]]
