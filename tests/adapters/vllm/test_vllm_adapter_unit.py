"""The vLLM adapter without an engine: vLLM's real loaders, validators and batch updates."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from dynlogits.processors.request import RequestLogitsProcessor

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.v1.sample.logits_processor import (  # noqa: E402
    AdapterLogitsProcessor,
    BatchUpdateBuilder,
    MoveDirectionality,
    build_logitsprocs,  # noqa: E402
    validate_logits_processors_parameters,
)
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    build_custom_logits_processors_params_validator,
)

from dynlogits.adapters.vllm import (  # noqa: E402
    PROCESSOR_FQCN,
    DynamoVllmLogitsProcessor,
    UnsupportedEngineConfig,
    check_engine_args,
    check_vllm_config,
    register_dynamo_logits_processor,
)
from dynlogits.sdk import GuardedRequest, apply_row  # noqa: E402
from dynlogits.specs import WIRE_KEY, SpecError  # noqa: E402

FORCED = [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 1}]
BAD = [{"kind": "forced_sequence", "token_ids": [5, -3], "eos_token_id": 1}]


def sp(payload: Any = None, **kw: Any) -> SamplingParams:
    return SamplingParams(extra_args=None if payload is None else {WIRE_KEY: payload}, **kw)


# -- one class, both interfaces ---------------------------------------------------------------
def test_one_class_satisfies_both_runner_interfaces():
    assert issubclass(DynamoVllmLogitsProcessor, AdapterLogitsProcessor)
    assert issubclass(DynamoVllmLogitsProcessor, V1LogitsProcessor)
    assert issubclass(DynamoVllmLogitsProcessor, V2LogitsProcessor)
    assert not DynamoVllmLogitsProcessor.__abstractmethods__


def test_v1_loader_builds_it_from_the_import_string(vllm_config):
    procs = build_logitsprocs(vllm_config, torch.device("cpu"), False, False, (PROCESSOR_FQCN,))
    ours = [p for p in procs.non_argmax_invariant if isinstance(p, DynamoVllmLogitsProcessor)]
    assert len(ours) == 1 and ours[0].runner == "v1"
    assert ours[0].vocab_size == vllm_config.model_config.get_vocab_size() == 1024  # logits width, not len(tokenizer)
    assert not ours[0].is_argmax_invariant()


# -- admission ----------------------------------------------------------------------------------
def test_validate_params_accepts_requests_without_or_with_a_good_payload():
    DynamoVllmLogitsProcessor.validate_params(sp())
    DynamoVllmLogitsProcessor.validate_params(sp(FORCED))
    DynamoVllmLogitsProcessor.validate_params(SamplingParams(extra_args={"other": 1}))


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (BAD, r"dynamo_logits\[0\]\.token_ids\[1\]"),
        ("{}", r"dynamo_logits: must be a list"),  # JSON text of something else than a list
        ([{"kind": "nope"}], r"dynamo_logits\[0\]"),
        ([{"kind": "forced_text", "text": "hi"}], r"dynamo_logits\[0\]"),
        ([{"kind": "python", "factory": "os:system", "kwargs": {}}], r"dynamo_logits\[0\]\.factory"),
    ],
)
def test_validate_params_names_the_bad_field(payload, field):
    with pytest.raises(SpecError, match=field):
        DynamoVllmLogitsProcessor.validate_params(sp(payload))


@pytest.mark.parametrize("runner_validator", ["v1", "v2"])
def test_vllms_own_admission_turns_it_into_a_validation_error(runner_validator):
    """What ``InputProcessor`` calls for each runner; ``VLLMValidationError`` becomes HTTP 400."""
    if runner_validator == "v1":
        validate = lambda p: validate_logits_processors_parameters([PROCESSOR_FQCN], p)  # noqa: E731
    else:
        validate = build_custom_logits_processors_params_validator((PROCESSOR_FQCN,))
    validate(sp(FORCED))
    with pytest.raises(VLLMValidationError, match=r"dynamo_logits\[0\]\.token_ids\[1\]: must be >= 0"):
        validate(sp(BAD))


# -- V1 batch bookkeeping -------------------------------------------------------------------------
def _v1(vllm_config) -> DynamoVllmLogitsProcessor:
    return DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)


def test_v1_rows_follow_adds_removes_moves_and_swaps(vllm_config):
    proc = _v1(vllm_config)
    out_a: list[int] = []
    out_b: list[int] = [5]
    builder = BatchUpdateBuilder()
    builder.added.append((0, sp([{"kind": "banned_tokens", "token_ids": [7]}]), [1, 2], out_a))
    builder.added.append((1, sp(FORCED), [1], out_b))
    builder.added.append((2, sp(), [1], []))
    proc.update_state(builder.get_and_reset(3))

    logits = proc.apply(torch.zeros(3, 1024))
    assert logits[0, 7] == -math.inf and logits[0, 6] == 0  # banned only
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [6]  # forced, position 1 (live output list)
    assert torch.equal(logits[2], torch.zeros(1024))  # no payload: untouched

    builder.moved.append((0, 1, MoveDirectionality.SWAP))
    proc.update_state(builder.get_and_reset(3))
    logits = proc.apply(torch.zeros(3, 1024))
    assert int(logits[0].argmax()) == 6 and logits[1, 7] == -math.inf

    builder.removed_append(0)
    builder.moved.append((1, 0, MoveDirectionality.UNIDIRECTIONAL))
    proc.update_state(builder.get_and_reset(1))
    logits = proc.apply(torch.zeros(1, 1024))
    assert logits[0, 7] == -math.inf


def test_v1_id_beyond_the_logits_width_fails_only_that_request_in_the_engine(vllm_config):
    """Admission cannot know the width; the engine fail-stops the request instead of crashing."""
    proc = _v1(vllm_config)
    wide = [{"kind": "banned_tokens", "token_ids": [4096]}]
    DynamoVllmLogitsProcessor.validate_params(sp(wide))  # width unknown at admission
    params = sp(wide)
    params.update_from_generation_config({}, eos_token_id=1)  # as the engine's input processor does
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1], []))
    builder.added.append((1, sp(FORCED), [1], []))
    proc.update_state(builder.get_and_reset(2))
    logits = proc.apply(torch.zeros(2, 1024))
    assert int(logits[0].argmax()) == 1 and logits[0].isinf().sum() == 1023
    assert int(logits[1].argmax()) == 5
    assert len(proc.failures) == 1 and "must be < vocab size 1024" in proc.failures[0]


def _placeholder_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "placeholder id -1" in r.getMessage()]


def test_a_placeholder_ending_a_history_is_reported_once_within_a_step_per_row(vllm_config, caplog):
    """One row that reads tokens is checked per step, in turn (async scheduling without vLLM's repair)."""
    proc = _v1(vllm_config)
    phrase = [{"kind": "banned_phrases", "phrases": [[5, 6]]}]
    outputs: list[list[int]] = [[3], [4], [9], [3, -1]]
    builder = BatchUpdateBuilder()
    for i, output in enumerate(outputs):
        builder.added.append((i, sp(phrase), [1], output))
    builder.added.append((4, sp([{"kind": "banned_tokens", "token_ids": [7]}]), [1], [-1]))  # reads no tokens
    proc.update_state(builder.get_and_reset(5))
    for _ in range(len(outputs)):
        proc.update_state(None)
        proc.apply(torch.zeros(5, 1024))
    assert len(_placeholder_messages(caplog)) == 1
    for _ in range(2 * len(outputs)):
        proc.apply(torch.zeros(5, 1024))
    assert len(_placeholder_messages(caplog)) == 1


def test_histories_without_a_placeholder_are_never_reported(vllm_config, caplog):
    proc = _v1(vllm_config)
    builder = BatchUpdateBuilder()
    builder.added.append((0, sp([{"kind": "banned_phrases", "phrases": [[5, 6]]}]), [1], [3, 5]))
    builder.added.append((1, sp([{"kind": "banned_tokens", "token_ids": [7]}]), [1], [-1]))  # reads no tokens
    proc.update_state(builder.get_and_reset(2))
    for _ in range(4):
        logits = proc.apply(torch.zeros(2, 1024))
    assert logits[0, 6] == -math.inf and not _placeholder_messages(caplog)


# -- failure isolation ----------------------------------------------------------------------------
class _Boom:
    def __call__(self, output_ids, row):
        row[3] = 123.0
        raise RuntimeError("kaboom")


def test_a_raising_request_is_fail_stopped_and_reported_once(caplog):
    reports: list[str] = []
    req = GuardedRequest(RequestLogitsProcessor([_Boom()]), stop_token_id=2, report=reports.append)
    row = torch.zeros(16)
    assert apply_row(req, [], row) is row
    assert int(row.argmax()) == 2 and row.isinf().sum() == 15  # partial edits overwritten
    row2 = torch.zeros(16)
    apply_row(req, [9], row2)
    assert int(row2.argmax()) == 2
    assert len(reports) == 1 and "RuntimeError: kaboom" in reports[0] and "stop token 2" in reports[0]
    assert any(r.levelname == "ERROR" and "kaboom" in r.getMessage() for r in caplog.records)


def test_a_raising_request_without_stop_token_is_reported_and_left_unconstrained():
    reports: list[str] = []
    req = GuardedRequest(RequestLogitsProcessor([_Boom()]), stop_token_id=None, report=reports.append)
    row = torch.zeros(16)
    apply_row(req, [], row)
    assert not row.isinf().any() and "continues unconstrained" in reports[0]


# -- registration and capabilities ---------------------------------------------------------------
def test_register_is_idempotent_and_keeps_other_processors():
    args = EngineArgs(model="m", logits_processors=["pkg.mod:Other"])
    assert register_dynamo_logits_processor(args) is args
    register_dynamo_logits_processor(args)
    assert args.logits_processors == ["pkg.mod:Other", PROCESSOR_FQCN]


def test_register_recognises_the_class_object_and_other_spellings():
    args = AsyncEngineArgs(model="m", logits_processors=[DynamoVllmLogitsProcessor])
    register_dynamo_logits_processor(args)
    assert args.logits_processors == [DynamoVllmLogitsProcessor]
    kwargs: dict[str, Any] = {"model": "m", "logits_processors": ["dynlogits.adapters.vllm.processor:DynamoVllmLogitsProcessor"]}
    register_dynamo_logits_processor(kwargs)
    assert len(kwargs["logits_processors"]) == 1
    assert register_dynamo_logits_processor({"model": "m"})["logits_processors"] == [PROCESSOR_FQCN]


def test_register_refuses_pooling_models():
    with pytest.raises(UnsupportedEngineConfig, match="pooling models have no sampler"):
        register_dynamo_logits_processor(EngineArgs(model="m", runner="pooling"))
    with pytest.raises(UnsupportedEngineConfig, match="pooling"):
        check_engine_args({"model": "m", "convert": "embed"})


def test_speculative_decoding_is_refused_where_the_v1_runner_will_run(monkeypatch):
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    with pytest.raises(UnsupportedEngineConfig, match="Triton is unavailable"):  # this CPU machine
        register_dynamo_logits_processor(EngineArgs(model="m", speculative_config=spec))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(UnsupportedEngineConfig, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        check_engine_args(EngineArgs(model="m", speculative_config=spec))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    check_engine_args(EngineArgs(model="m", speculative_config=spec))  # V2 runs custom processors per draft row
    with pytest.raises(UnsupportedEngineConfig, match="'suffix' runs on the V1 runner only"):
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
        monkeypatch.setattr("vllm.triton_utils.HAS_TRITON", True)
        check_engine_args(EngineArgs(model="m", speculative_config={"method": "suffix"}))


def test_resolved_config_checks(vllm_config):
    check_vllm_config(vllm_config)  # generating model, no speculation: fine

    class Spec:
        speculative_config = object()
        use_v2_model_runner = False
        model_config = None

    with pytest.raises(UnsupportedEngineConfig, match="speculative decoding on vLLM's V1 model runner"):
        check_vllm_config(Spec())
