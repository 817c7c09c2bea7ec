"""The SGLang adapter inside SGLang 0.5.23's real classes: ``Req``, ``ScheduleBatch``,
``SamplingBatchInfo`` (``from_schedule_batch``, ``filter_batch``, ``merge_batch``), its msgpack request
decoder and its own ``apply_custom_logit_processor``. SGLang's engine is never started (it needs a GPU);
the scheduler's bookkeeping is played by ``SglangSchedulerHarness``, which says what it mirrors."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest
import torch

from dynlogits.adapters.sglang import activate, check_server_args, enable_adapter, encode_carried
from dynlogits.adapters.sglang.processor import FAILURES, REQUEST_KEY, processor_string
from dynlogits.adapters.sglang.harness import SglangSchedulerHarness, decode_like_sglang
from dynlogits.adapters.sglang.engine import UnsupportedEngineConfig
from dynlogits.specs import WIRE_KEY, ForcedTokenSequenceSpec, encode_entries
from dynlogits.testing import CHECKS

VOCAB = 64
EOS = 1
FORCED = [10, 11, 12, 13, 14, 15]


def _forced(ids=FORCED):
    return encode_entries([ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=EOS)])


def _params(payload, **extra):
    return {"max_new_tokens": 32, "custom_params": {WIRE_KEY: encode_carried(payload)}, **extra}


def _run(harness, rids, steps, *, committed=None):
    """Greedy decoding of ``rids`` for ``steps`` steps; returns each request's tokens."""
    out = committed if committed is not None else {r: [] for r in rids}
    for step in range(steps):
        logits = harness.step(rids, torch.randn(len(rids), VOCAB, generator=torch.Generator().manual_seed(step)))
        for row, rid in enumerate(rids):
            token = int(logits[row].argmax())
            harness.commit(rid, token)
            out.setdefault(rid, []).append(token)
    return out


def test_processor_string_names_the_installed_class_and_carries_no_code():
    text = processor_string()
    raw = bytes.fromhex(json.loads(text)["callable"])
    assert len(raw) < 200 and b"dynlogits.adapters.sglang.processor" in raw and b"co_code" not in raw
    script = ("from dynlogits.adapters.sglang.compat import import_sglang_srt; import_sglang_srt();"
              "import sys; from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor;"
              "p = CustomLogitProcessor.from_str(sys.stdin.read()); print(type(p).__module__, type(p).__name__)")
    proc = subprocess.run([sys.executable, "-c", script], input=text, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["dynlogits.adapters.sglang.processor", "DynamoSglangLogitProcessor"], proc.stderr[-2000:]


def test_payload_as_json_text_survives_sglangs_request_decoder_and_a_list_of_objects_does_not():
    payload = _forced()
    wire = decode_like_sglang(_params(payload), rid="a", input_ids=[3, 4], custom_logit_processor=processor_string())
    assert json.loads(wire.sampling_params.custom_params[WIRE_KEY]) == payload
    assert wire.custom_logit_processor == processor_string()
    with pytest.raises(msgspec.ValidationError):
        decode_like_sglang({"custom_params": {WIRE_KEY: payload}}, rid="b", input_ids=[3], custom_logit_processor=None)


@pytest.mark.parametrize("mode", ["overlap", "overlap-delay-sample", "no-overlap"])
def test_forced_sequence_is_exact_whether_or_not_output_ids_lags(mode):
    harness = SglangSchedulerHarness(VOCAB, mode=mode)
    harness.add("r", prompt_ids=[3, 4, 5], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    assert _run(harness, ["r"], 8)["r"] == FORCED + [EOS, EOS]
    positions = [position for _, position in harness.requests["r"].calls]
    assert positions == list(range(8))
    lag = [position - seen for seen, position in harness.requests["r"].calls]
    # overlap without delayed sampling: output_ids is one token behind on every decode step (sglang issue 8056)
    assert lag == ([0] + [1] * 7 if mode == "overlap" else [0] * 8)


def test_retracted_request_resumes_at_its_position_under_the_overlap_scheduler():
    harness = SglangSchedulerHarness(VOCAB, mode="overlap")
    for rid in ("r", "other"):
        harness.add(rid, prompt_ids=[3, 4], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    tokens = _run(harness, ["r", "other"], 3)
    _run(harness, ["other"], 1, committed=tokens)  # "r" is retracted (Req.reset_for_retract), "other" decodes
    req = harness.requests["r"].req
    assert req.retraction_count == 1 and req.kv.kv_committed_len == 0
    _run(harness, ["other", "r"], 3, committed=tokens)  # "r" comes back through a re-prefill
    assert tokens["r"] == FORCED
    assert tokens["other"] == FORCED + [EOS]


def test_prefill_batches_merged_into_the_running_batch_keep_every_requests_position():
    harness = SglangSchedulerHarness(VOCAB, mode="overlap-delay-sample")
    harness.add("a", prompt_ids=[3], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    tokens = _run(harness, ["a"], 2)
    first = next(iter(harness.running_info.custom_logit_processor.values())).processor
    harness.add("b", prompt_ids=[7, 8], sampling_params=_params(_forced([20, 21, 22])), custom_logit_processor=processor_string())
    _run(harness, ["a", "b"], 3, committed=tokens)
    kept = next(iter(harness.running_info.custom_logit_processor.values()))
    assert kept.processor is first and kept.rows == [0, 1]  # merge_batch kept the running batch's instance
    assert tokens["a"] == FORCED[:5] and tokens["b"] == [20, 21, 22]


def test_n_samples_are_separate_requests_each_with_its_own_history_and_processors():
    harness = SglangSchedulerHarness(VOCAB, mode="overlap")
    params = _params([{"kind": "min_tokens", "min_tokens": 3, "stop_token_ids": [EOS]}], n=2)
    for i in range(2):  # SGLang expands n=2 into two Reqs sharing one processor string and custom_params
        harness.add(f"s{i}", prompt_ids=[3, 4], sampling_params=params, custom_logit_processor=processor_string())
    eos_high = torch.zeros(2, VOCAB)
    eos_high[:, EOS] = 5.0
    seen = []
    for step in range(4):
        logits = harness.step(["s0", "s1"], eos_high.clone())
        seen.append([float(logits[r, EOS]) for r in range(2)])
        for rid in ("s0", "s1"):
            harness.commit(rid, 2)
    assert seen == [[float("-inf")] * 2] * 3 + [[5.0, 5.0]]
    dicts = [harness.requests[r].req.sampling_params.custom_params for r in ("s0", "s1")]
    assert dicts[0] is not dicts[1] and dicts[0][REQUEST_KEY] is not dicts[1][REQUEST_KEY]


def test_a_middle_prefill_chunk_row_is_left_untouched():
    harness = SglangSchedulerHarness(VOCAB, mode="overlap")
    req = harness.add("c", prompt_ids=list(range(2, 12)), sampling_params=_params(_forced()),
                      custom_logit_processor=processor_string())
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    req.kv.kv_committed_len = 4  # alloc_for_extend of a 4-token first chunk of a 10-token prompt
    info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=[req], device="cpu"), VOCAB)
    logits = torch.randn(1, VOCAB)
    before = logits.clone()
    apply_custom_logit_processor(logits, info)
    assert torch.equal(logits, before)


def test_speculative_verify_rows_fail_stop_their_request_and_are_reported():
    FAILURES.clear()
    harness = SglangSchedulerHarness(VOCAB, mode="no-overlap")
    req = harness.add("v", prompt_ids=[3], sampling_params=_params(_forced()), custom_logit_processor=processor_string(),
                      eos_token_ids={EOS})
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    req.kv.kv_committed_len = 1
    info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=[req], device="cpu"), VOCAB)
    logits = torch.randn(2, VOCAB)
    apply_custom_logit_processor(logits, info, num_tokens_in_batch=2)  # DFlash's verify call
    for row in logits:
        assert torch.isfinite(row).nonzero().flatten().tolist() == [EOS]
    assert len(FAILURES) == 1 and "speculative" in FAILURES[0]


def test_activation_never_forwards_a_client_processor_and_clears_a_smuggled_payload():
    from sglang.srt.managers.io_struct import GenerateReqInput

    request = GenerateReqInput(input_ids=[1, 2], custom_logit_processor="client dill string",
                               sampling_params={"custom_params": {WIRE_KEY: "[]", "other": 1}})
    fields = activate(request, [])
    assert request.custom_logit_processor is None and fields.custom_logit_processor is None
    assert request.sampling_params["custom_params"] == {"other": 1}
    entries = [ForcedTokenSequenceSpec(token_ids=(5,), eos_token_id=EOS)]
    fields = activate(request, entries)
    assert request.custom_logit_processor == processor_string() == fields.custom_logit_processor
    assert json.loads(request.sampling_params["custom_params"][WIRE_KEY]) == encode_entries(entries)


def test_engine_settings_enable_custom_processors_and_refuse_what_cannot_work():
    assert enable_adapter({"model_path": "m"})["enable_custom_logit_processor"] is True
    with pytest.raises(UnsupportedEngineConfig, match="speculative"):
        check_server_args({"speculative_algorithm": "EAGLE"})
    with pytest.raises(UnsupportedEngineConfig, match="watermark"):
        enable_adapter({"enable_watermark": True})


def test_conformance_command_passes_for_sglang_with_its_real_classes():
    proc = subprocess.run([sys.executable, "-m", "dynlogits.cli", "conformance", "sglang"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any("driver sglang-overlap: SGLang 0.5.23: real DynamoSglangLogitProcessor" in line for line in lines)
    assert lines[-1] == f"{2 * len(CHECKS)} passed, 0 failed"  # two drivers, every check
