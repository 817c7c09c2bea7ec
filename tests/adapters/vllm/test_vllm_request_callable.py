"""``new_req_logits_processor(params)`` honours vLLM's per-request callable contract.

vLLM's ``AdapterLogitsProcessor`` documents it: the method returns ``None`` (the request needs no
processor) or a ``RequestLogitsProcessor``, a callable ``(output_ids, logits_row) -> logits_row``
that edits the 1-D row in place and returns it, where ``output_ids`` is the request's live list of
generated tokens. NVIDIA Dynamo's tests for its own vLLM adapter
(``components/src/dynamo/vllm/tests/test_vllm_logits_runtime.py``) state what a Dynamo user expects
of it: ``token_ids[0]``, ``token_ids[1]``, then EOS on successive calls; fresh state per call.

Real parts: the processor built from a real ``VllmConfig`` of the embedded model, payloads put on
real ``SamplingParams`` by the SDK's ``activate``, and vLLM's own ``AdapterLogitsProcessor._new_state``
(how vLLM binds the callable to a request's live output list).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor, activate  # noqa: E402
from dynlogits.specs import ForcedTokenSequenceSpec, PythonProcessorSpec  # noqa: E402
from dynlogits.testing.faults import RAISE_AFTER_FACTORY  # noqa: E402

VOCAB = 1024  # the embedded model's logits width
EOS = 2
FORCED = [ForcedTokenSequenceSpec(token_ids=(5, 6), eos_token_id=EOS)]


@pytest.fixture()
def processor(vllm_config: Any) -> DynamoVllmLogitsProcessor:
    return DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)


def activated(entries: list[Any], **kwargs: Any) -> SamplingParams:
    params = SamplingParams(**kwargs)
    activate(params, entries)
    params.update_from_generation_config({}, eos_token_id=EOS)  # as the engine's input processor does
    return params


def argmax(row: torch.Tensor) -> int:
    return int(row.argmax())


def test_a_request_without_a_payload_gets_no_processor(processor: DynamoVllmLogitsProcessor) -> None:
    assert processor.new_req_logits_processor(SamplingParams()) is None
    assert processor.new_req_logits_processor(SamplingParams(extra_args={})) is None
    assert processor.new_req_logits_processor(SamplingParams(extra_args={"kv_transfer_params": {"x": 1}})) is None


def test_the_callable_forces_each_token_then_eos_editing_the_row_in_place(processor: DynamoVllmLogitsProcessor) -> None:
    request = processor.new_req_logits_processor(activated(FORCED))
    assert callable(request)
    for output_ids, expected in (([], 5), ([5], 6), ([5, 6], EOS), ([5, 6, EOS], EOS)):
        row = torch.randn(VOCAB)
        returned = request(output_ids, row)
        assert returned is row  # in place, and returned
        assert argmax(row) == expected, output_ids
        assert torch.isfinite(row).sum() == 1  # nothing else can be sampled


def test_vllms_own_binding_calls_it_with_the_live_output_list(processor: DynamoVllmLogitsProcessor) -> None:
    """``AdapterLogitsProcessor._new_state`` counts the callable's parameters to decide whether to pass
    the prompt, and binds the live list: each call sees the tokens appended since."""
    request = processor.new_req_logits_processor(activated(FORCED))
    assert len(inspect.signature(request).parameters) == 2
    output_ids: list[int] = []
    bound = AdapterLogitsProcessor._new_state(processor, activated(FORCED), [1, 2, 3], output_ids)
    assert bound is not None
    chosen = []
    for _ in range(3):
        token = argmax(bound(torch.randn(VOCAB)))
        chosen.append(token)
        output_ids.append(token)
    assert chosen == [5, 6, EOS]


def test_each_call_realizes_fresh_state(processor: DynamoVllmLogitsProcessor) -> None:
    params = activated(FORCED)
    first, second = processor.new_req_logits_processor(params), processor.new_req_logits_processor(params)
    assert first is not second
    first([], torch.zeros(VOCAB))
    first([5], torch.zeros(VOCAB))
    row = torch.zeros(VOCAB)
    second([], row)
    assert argmax(row) == 5


def test_a_raising_processor_ends_only_its_own_request(processor: DynamoVllmLogitsProcessor,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", RAISE_AFTER_FACTORY)
    failing = processor.new_req_logits_processor(
        activated([PythonProcessorSpec(factory=RAISE_AFTER_FACTORY, kwargs={"after": 1})]))
    healthy = processor.new_req_logits_processor(activated(FORCED))
    row = torch.randn(VOCAB)
    before = row.clone()
    assert torch.equal(failing([], row), before)  # nothing raised yet: the row is untouched
    row = torch.randn(VOCAB)
    assert failing([7], row) is row  # raises inside: no exception reaches the caller
    assert argmax(row) == EOS and row[EOS] == 0 and torch.isinf(row).sum() == VOCAB - 1
    assert len(processor.failures) == 1 and "injected fault after 1 tokens" in processor.failures[0]
    row = torch.randn(VOCAB)
    healthy([], row)
    assert argmax(row) == 5 and not math.isinf(float(row[5]))
    row = torch.randn(VOCAB)
    failing([7, EOS], row)  # stays stopped, reported once
    assert argmax(row) == EOS and len(processor.failures) == 1


def test_the_v1_runner_still_applies_what_it_realizes(processor: DynamoVllmLogitsProcessor) -> None:
    """The runner's own bookkeeping (``update_state``/``apply``) realizes through the same method."""
    from vllm.v1.sample.logits_processor import BatchUpdateBuilder

    params = activated(FORCED)
    output_ids: list[int] = [5]
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1], output_ids))
    processor.update_state(builder.get_and_reset(1))
    logits = processor.apply(torch.zeros(1, VOCAB))
    assert argmax(logits[0]) == 6
