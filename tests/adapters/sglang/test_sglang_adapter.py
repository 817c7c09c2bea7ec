"""The SGLang adapter inside SGLang's real classes: ``Req``, ``ScheduleBatch``, ``SamplingBatchInfo``
(``from_schedule_batch``, ``filter_batch``, ``merge_batch``), its request transports (msgpack, pickle)
and its own ``apply_custom_logit_processor``. SGLang's engine is never started (it needs a GPU); the
scheduler's bookkeeping is played by ``SglangSchedulerHarness``, which says what it mirrors.

These tests run on SGLang 0.5.23 (the environment's) and again on 0.5.21 in a subprocess
(``test_sglang_versions.py``): nothing here names a version."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest
import torch

from dynlogits.adapters.sglang import activate, check_server_args, enable_adapter, encode_carried, validate
from dynlogits.adapters.sglang.compat import sglang_version
from dynlogits.adapters.sglang.engine import UnsupportedEngineConfig
from dynlogits.adapters.sglang.harness import SglangSchedulerHarness, decode_like_sglang
from dynlogits.adapters.sglang.processor import FAILURES, REQUEST_KEY, processor_string
from dynlogits.specs import WIRE_KEY, ForcedTokenSequenceSpec, SpecError, encode_entries
from dynlogits.specs.schema import golden_vectors
from dynlogits.testing import CHECKS
from dynlogits.testing.faults import RAISE_AFTER_FACTORY

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


def test_json_text_survives_both_sglang_transports_and_dynamos_list_only_the_default_pickle_one():
    payload = _forced()
    for ipc in ("msgpack", "pickle"):
        wire = decode_like_sglang(_params(payload), rid="a", input_ids=[3, 4], custom_logit_processor=processor_string(),
                                  ipc=ipc)
        assert json.loads(wire.sampling_params.custom_params[WIRE_KEY]) == payload
        assert wire.custom_logit_processor == processor_string()
    listed = {"custom_params": {WIRE_KEY: payload, "dynamo_uid": "ctx-1"}}
    wire = decode_like_sglang(listed, rid="b", input_ids=[3], custom_logit_processor=None, ipc="pickle")
    assert wire.sampling_params.custom_params[WIRE_KEY] == payload
    with pytest.raises(msgspec.ValidationError):  # SGLANG_USE_PICKLE_IPC=0: typed CustomParamValue decoding
        decode_like_sglang(listed, rid="b", input_ids=[3], custom_logit_processor=None, ipc="msgpack")


def test_a_payload_written_by_nvidia_dynamo_realizes_like_ours_and_its_uid_is_ignored():
    from dynamo.common.backend.engine import ForcedTokenSequenceSpec as DynamoForced
    from dynamo.common.backend.engine import serialize_logits_processor_entries

    theirs = {WIRE_KEY: serialize_logits_processor_entries([DynamoForced(token_ids=tuple(FORCED), eos_token_id=EOS)]),
              "dynamo_uid": "ctx-1"}
    assert isinstance(theirs[WIRE_KEY], list)
    harness = SglangSchedulerHarness(VOCAB, mode="overlap", ipc="pickle")
    harness.add("dynamo", prompt_ids=[3, 4], sampling_params={"max_new_tokens": 32, "custom_params": theirs},
                custom_logit_processor=processor_string())
    harness.add("ours", prompt_ids=[3, 4], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    tokens = _run(harness, ["dynamo", "ours"], 8)
    assert tokens["dynamo"] == tokens["ours"] == FORCED + [EOS, EOS]


def test_both_encodings_get_the_same_verdict_for_every_golden_vector():
    checked = 0
    for name, vector in golden_vectors():
        if not isinstance(vector["payload"], list):
            continue
        verdicts = []
        for carried in (vector["payload"], encode_carried(vector["payload"])):
            try:
                validate({WIRE_KEY: carried})
                verdicts.append("admitted")
            except SpecError as err:
                verdicts.append(str(err))
        assert verdicts[0] == verdicts[1], name
        if not vector["valid"]:
            assert verdicts[0] != "admitted", name
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("value", [{"kind": "forced_sequence"}, 7, True])
def test_a_carried_value_that_is_neither_a_list_nor_text_is_refused_naming_the_field(value):
    with pytest.raises(SpecError, match=r"dynamo_logits: must be a list"):
        validate({WIRE_KEY: value})


def test_json_text_nested_too_deeply_is_refused_at_admission_and_fails_only_its_request_in_the_engine():
    deep = "[" * 100_000  # the json module raises RecursionError, not ValueError, on this
    with pytest.raises(SpecError, match="custom_params.dynamo_logits: is JSON nested too deeply"):
        validate({WIRE_KEY: deep})
    FAILURES.clear()
    harness = SglangSchedulerHarness(VOCAB, mode="no-overlap")
    harness.add("deep", prompt_ids=[3], sampling_params={"max_new_tokens": 8, "custom_params": {WIRE_KEY: deep}},
                custom_logit_processor=processor_string(), eos_token_ids={EOS})
    harness.add("ok", prompt_ids=[3], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    tokens = _run(harness, ["deep", "ok"], 2)
    assert tokens == {"deep": [EOS, EOS], "ok": FORCED[:2]}
    assert len(FAILURES) == 1 and "nested too deeply" in FAILURES[0]


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
    for _ in range(4):
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
    from sglang.srt.layers.sampler import apply_custom_logit_processor
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    req.kv.kv_committed_len = 4  # alloc_for_extend of a 4-token first chunk of a 10-token prompt
    info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=[req], device="cpu"), VOCAB)
    logits = torch.randn(1, VOCAB)
    before = logits.clone()
    apply_custom_logit_processor(logits, info)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("hidden", [("kv", "kv_committed_len"), ("origin_input_ids",), ("output_ids",)])
def test_a_req_missing_what_the_adapter_reads_fails_only_its_request_and_the_other_rows_are_processed(hidden):
    FAILURES.clear()
    harness = SglangSchedulerHarness(VOCAB, mode="overlap-delay-sample")
    for rid, ids in (("a", FORCED), ("bad", [20, 21, 22]), ("c", [30, 31, 32])):
        harness.add(rid, prompt_ids=[3, 4], sampling_params=_params(_forced(ids)), custom_logit_processor=processor_string(),
                    eos_token_ids={EOS})
    harness.present_req_as("bad", hidden=hidden)  # an SGLang version whose Req lacks it
    tokens = _run(harness, ["a", "bad", "c"], 3)
    assert tokens == {"a": FORCED[:3], "bad": [EOS] * 3, "c": [30, 31, 32]}
    assert len(FAILURES) == 1 and hidden[-1] in FAILURES[0] and "Req" in FAILURES[0]


def test_the_older_layout_with_kv_committed_len_on_req_itself_is_read_exactly():
    harness = SglangSchedulerHarness(VOCAB, mode="overlap")
    harness.add("r", prompt_ids=[3, 4, 5], sampling_params=_params(_forced()), custom_logit_processor=processor_string())
    # SGLang 0.5.9: Req.kv_committed_len (ScheduleBatch.prepare_for_extend / prepare_for_decode), no Req.kv
    harness.present_req_as("r", hidden=("kv",), renamed={"kv_committed_len": ("kv", "kv_committed_len")})
    FAILURES.clear()
    assert _run(harness, ["r"], 8)["r"] == FORCED + [EOS, EOS]
    assert not FAILURES


def test_two_tensor_parallel_ranks_make_the_same_edits_and_the_same_failures(monkeypatch):
    """Every TP rank runs its own scheduler, Reqs and processor on the same inputs, and SGLang syncs the
    sampled ids only with SYNC_TOKEN_IDS_ACROSS_TP=1 or a grammar: two independent harnesses stand for two ranks."""
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", RAISE_AFTER_FACTORY)
    payloads = {
        "forced": _forced(),
        "min_tokens": [{"kind": "min_tokens", "min_tokens": 3, "stop_token_ids": [EOS]}],
        "bias": [{"kind": "logit_bias", "bias": {"7": 4.5, "9": -2.0}}],
        "raises": [{"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 2}}],
        "beyond": _forced([VOCAB + 5]),
        "unreadable": _forced([40, 41, 42]),
    }
    rids = list(payloads)
    ranks = [SglangSchedulerHarness(VOCAB, mode="overlap-delay-sample") for _ in range(2)]
    for rank in ranks:
        for rid, payload in payloads.items():
            rank.add(rid, prompt_ids=[3, 4], sampling_params=_params(payload), custom_logit_processor=processor_string(),
                     eos_token_ids={EOS})
        rank.present_req_as("unreadable", hidden=("kv", "kv_committed_len"))
    for step in range(5):
        raw = torch.randn(len(rids), VOCAB, generator=torch.Generator().manual_seed(step))
        edited = [rank.step(rids, raw.clone()) for rank in ranks]
        assert torch.equal(edited[0], edited[1]), f"ranks diverged at step {step}"
        assert not torch.equal(edited[0], raw)
        for row, rid in enumerate(rids):  # each rank samples the same id: nothing needs syncing
            token = int(edited[0][row].argmax())
            for rank in ranks:
                rank.commit(rid, token)
    errors = [{rid: rank.requests[rid].req.sampling_params.custom_params[REQUEST_KEY].error for rid in rids}
              for rank in ranks]
    assert errors[0] == errors[1]
    assert sorted(rid for rid, error in errors[0].items() if error) == ["beyond", "raises", "unreadable"]


def test_speculative_verify_rows_fail_stop_their_request_and_are_reported():
    FAILURES.clear()
    harness = SglangSchedulerHarness(VOCAB, mode="no-overlap")
    req = harness.add("v", prompt_ids=[3], sampling_params=_params(_forced()), custom_logit_processor=processor_string(),
                      eos_token_ids={EOS})
    from sglang.srt.layers.sampler import apply_custom_logit_processor
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    req.kv.kv_committed_len = 1
    info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=[req], device="cpu"), VOCAB)
    logits = torch.randn(2, VOCAB)
    apply_custom_logit_processor(logits, info, num_tokens_in_batch=2)  # DFlash's verify call
    for row in logits:
        assert torch.isfinite(row).nonzero().flatten().tolist() == [EOS]
    assert len(FAILURES) == 1 and "speculative" in FAILURES[0]


def test_a_scheduler_configured_for_speculative_decoding_fails_each_request_on_its_first_row(monkeypatch):
    """SGLang started without the worker's check (e.g. by another launcher) with EAGLE: its prefill token
    still goes through the normal sampler; the processor reads the scheduler's published server args
    (``runtime_context.get_server_args``, stood in for here: a real ServerArgs with a speculative
    algorithm needs a draft model) and stops the request with the refusal message."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context

    monkeypatch.setattr(runtime_context, "get_server_args", lambda: SimpleNamespace(speculative_algorithm="EAGLE"))
    FAILURES.clear()
    harness = SglangSchedulerHarness(VOCAB, mode="no-overlap")
    harness.add("spec", prompt_ids=[3], sampling_params=_params(_forced()), custom_logit_processor=processor_string(),
                eos_token_ids={EOS})
    harness.add("plain", prompt_ids=[3], sampling_params={"max_new_tokens": 8}, custom_logit_processor=None)
    raw = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    logits = harness.step(["spec", "plain"], raw.clone())
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    assert torch.equal(logits[1], raw[1])
    assert len(FAILURES) == 1 and "speculative_algorithm='EAGLE'" in FAILURES[0]


def test_activation_never_forwards_a_client_processor_and_clears_a_smuggled_payload():
    from sglang.srt.managers.io_struct import GenerateReqInput

    request = GenerateReqInput(input_ids=[1, 2], custom_logit_processor="client dill string",
                               sampling_params={"custom_params": {WIRE_KEY: "[]", "other": 1}})
    fields = activate(request, [])
    assert request.custom_logit_processor is None and fields.custom_logit_processor is None
    assert request.sampling_params["custom_params"] == {"other": 1}
    listed = GenerateReqInput(input_ids=[1, 2], sampling_params={"custom_params": {WIRE_KEY: [{"kind": "smuggled"}]}})
    activate(listed, [])  # Dynamo's form is cleared the same way
    assert listed.sampling_params["custom_params"] is None and listed.custom_logit_processor is None
    entries = [ForcedTokenSequenceSpec(token_ids=(5,), eos_token_id=EOS)]
    fields = activate(request, entries)
    assert request.custom_logit_processor == processor_string() == fields.custom_logit_processor
    assert json.loads(request.sampling_params["custom_params"][WIRE_KEY]) == encode_entries(entries)


def test_engine_settings_enable_custom_processors_and_refuse_what_cannot_work():
    assert enable_adapter({"model_path": "m"})["enable_custom_logit_processor"] is True
    for off in (None, "NONE", "none"):
        check_server_args({"speculative_algorithm": off})
    for algorithm in ("EAGLE", "EAGLE3", "NGRAM", "STANDALONE", "DFLASH", "DSPARK", "UNO"):
        with pytest.raises(UnsupportedEngineConfig, match=rf"speculative_algorithm='{algorithm}'.*skipped silently.*"
                                                           "run without --speculative-algorithm"):
            check_server_args({"speculative_algorithm": algorithm})
    with pytest.raises(UnsupportedEngineConfig, match="watermark"):
        enable_adapter({"enable_watermark": True})


def test_in_this_sglang_eagle_and_ngram_verify_skip_custom_processors_and_dflash_verify_calls_them():
    """The engine facts behind the speculative refusal, read from the installed SGLang's source
    (its speculative modules need sgl-kernel to import)."""
    import ast
    from pathlib import Path

    import sglang

    speculative = Path(sglang.__path__[0]) / "srt" / "speculative"

    def function(module: str, name: str) -> str:
        source = (speculative / module).read_text()
        node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
        return ast.get_source_segment(source, node) or ""

    assert "apply_custom_logit_processor" not in (speculative / "eagle_utils.py").read_text()
    assert "custom_logit_processor" not in function("eagle_utils.py", "eagle_sample")
    assert "eagle_sample(" in (speculative / "ngram_worker.py").read_text()
    assert "eagle_sample(" in (speculative / "eagle_worker_common.py").read_text()
    assert "num_tokens_in_batch=draft_token_num" in function("dflash_utils.py", "apply_dflash_verify_logits_adjustments")


@pytest.mark.heavy  # runs the kit's command in a subprocess
def test_conformance_command_passes_for_sglang_with_its_real_classes():
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "sglang"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    version = sglang_version()  # the subprocess imports the same SGLang (PYTHONPATH is inherited)
    for driver in ("sglang-overlap", "sglang-no-overlap", "sglang-dynamo-list"):
        assert any(f"driver {driver}: SGLang {version}: real DynamoSglangLogitProcessor" in line for line in lines)
    assert lines[-1] == f"{3 * len(CHECKS)} passed, 0 failed"  # three drivers, every check, none skipped
