"""The TensorRT-LLM adapter, driven with TensorRT-LLM 1.3.0rc29's shapes and call patterns.

TensorRT-LLM itself is **not installed** (its wheel is not on the package index reachable here, only a
stub that downloads it from NVIDIA's own index, and it needs CUDA): the harnesses in
``dynlogits.adapters.trtllm.harness`` model its PyTorch backend's call site
(``_execute_logit_post_processors``: ``[beam, 1, vocab]`` views, requests pickled into the executor)
and its TensorRT backend's (``LogitsPostProcessor``: ``[1 + draft, beam, vocab]`` decoder logits, the
per-request or the batched callback), including its rule that a processor exception fails every
request; each modelled behaviour cites the TensorRT-LLM source it was read from.

Named ``test_tensorrt_llm_*``: the ai-dynamo reference (installed for the compatibility tests) registers a
pytest plugin that silently skips ``test_trtllm_*.py`` files when ``tensorrt_llm`` is missing."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import time
import types

import pytest
import torch

from dynlogits.adapters.trtllm import (
    FAILURES,
    NOT_THROUGH_LLM_API,
    DynamoTrtllmBatchedLogitsProcessor,
    UnsupportedEngineConfig,
    activate,
    check_llm_args,
    register_ipc_classes,
)
from dynlogits.adapters.trtllm.harness import PytorchBackendHarness, SamplingParamsStandIn, TrtBackendHarness
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.specs import BannedTokensSpec, ForcedTokenSequenceSpec, PythonProcessorSpec, SpecError
from dynlogits.testing import CHECKS
from dynlogits.testing.faults import RAISE_AFTER_FACTORY

VOCAB = 48
EOS = 1


@pytest.fixture(autouse=True)
def _fresh_failure_log():
    FAILURES.clear()


def _params(ids=None, *, entries=None, generated_before=0, **fields):
    params = SamplingParamsStandIn(end_id=EOS, **fields)
    entries = entries if entries is not None else [ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=EOS)]
    activate(params, entries, vocab_size=VOCAB, generated_before=generated_before)
    return params


def _forced_only(row: torch.Tensor) -> int:
    finite = torch.isfinite(row).nonzero().flatten().tolist()
    assert len(finite) == 1, finite
    return finite[0]


def _drive(harness, widths: dict[int, int], steps: int, pick) -> dict[int, list[list[int]]]:
    """Run ``steps`` steps over all requests (each beam picks ``pick(row)`` from its own row)."""
    out = {r: [[] for _ in range(w)] for r, w in widths.items()}
    for step in range(steps):
        inputs = {r: torch.randn(harness.rows_of(r), VOCAB, generator=torch.Generator().manual_seed(10 * step + r))
                  for r in widths}
        result = harness.step(inputs)
        for r, rows in result.items():
            beam_rows = rows if rows.ndim == 2 else rows[0]  # PyTorch [rows, V]; TensorRT [1 + draft, beam, V]
            tokens = [pick(beam_rows[b]) for b in range(len(beam_rows))] * (widths[r] // len(beam_rows))
            harness.commit(r, tokens)
            for b in range(widths[r]):
                out[r][b].append(tokens[b])
    return out


# -- the shapes TensorRT-LLM 1.3.0rc29 passes --------------------------------------------------------
@pytest.mark.parametrize("beams", [1, 4])
def test_pytorch_backend_beam_rows_each_follow_their_own_history(beams):
    harness = PytorchBackendHarness()
    seqs = {0: [10, 11, 12, 13], 1: [20, 21, 22, 23], 2: [30, 31, 32, 33]}
    for r, ids in seqs.items():
        harness.add(r, [3, 4 + r], _params(ids), beam_width=beams)
    out = _drive(harness, {r: beams for r in seqs}, 5, _forced_only)
    assert all(out[r] == [ids + [EOS]] * beams for r, ids in seqs.items())


def test_beams_with_different_histories_get_different_positions():
    harness = PytorchBackendHarness()
    generated = [[10], [10, 11, 12], [], [10, 11]]  # generated_before: what the first beam carries
    harness.add(7, [3], _params([10, 11, 12, 13], generated_before=1), generated=generated)
    rows = harness.step({7: torch.randn(4, VOCAB)})[7]
    assert [_forced_only(row) for row in rows] == [11, 13, 10, 12]


@pytest.mark.parametrize("beams", [1, 4])
def test_tensorrt_backend_forces_every_beam_of_its_1_beam_vocab_decoder_logits(beams):
    harness = TrtBackendHarness()
    for r in range(2):
        harness.add(r, [3, 4], _params([10 + r, 20 + r, 30 + r]), beam_width=beams)
    out = _drive(harness, {0: beams, 1: beams}, 4, _forced_only)
    assert out == {r: [[10 + r, 20 + r, 30 + r, EOS]] * beams for r in range(2)}


def test_a_forced_sequence_under_beam_search_is_forced_on_every_beam_of_a_1_4_vocab_call():
    processor = _params([10, 11]).logits_processor
    logits = torch.randn(1, 4, VOCAB)  # TensorRT backend, beam search: [1, beam, vocab]
    processor(0, logits, [[3, 4]] * 4, None, 5)
    assert [_forced_only(row) for row in logits[0]] == [10] * 4 and not FAILURES


def test_one_beam_is_one_1_1_vocab_row():
    processor = _params([10, 11]).logits_processor
    first, second = torch.randn(1, 1, VOCAB), torch.randn(1, 1, VOCAB)
    processor(0, first, [[3, 4]], None, None)
    processor(0, second, [[3, 4, 10]], None, None)
    assert (_forced_only(first[0, 0]), _forced_only(second[0, 0])) == (10, 11) and not FAILURES


def test_draft_rows_are_processed_after_the_tokens_the_rows_before_them_force():
    harness = TrtBackendHarness()
    harness.add(0, [3, 4], _params([10, 11, 12, 13]), draft_len=2)
    context = harness.step({0: torch.randn(VOCAB)})[0]  # the context step: [1, 1, vocab]
    harness.commit(0, [_forced_only(context[0, 0])])
    logits = harness.step({0: torch.randn(3, VOCAB)})[0]  # then 1 + 2 rows per step
    assert logits.shape == (3, 1, VOCAB)
    assert [_forced_only(row[0]) for row in logits] == [11, 12, 13] and not FAILURES


def test_draft_rows_after_an_unforced_row_are_masked_to_the_stop_token_with_one_warning(caplog):
    params = _params(entries=[BannedTokensSpec(token_ids=(5,))])
    processor = pickle.loads(pickle.dumps(params)).logits_processor
    with caplog.at_level(logging.WARNING, logger="dynlogits.adapters.trtllm"):
        for step in range(2):
            logits = torch.randn(1 + 2, 1, VOCAB)
            raw = logits.clone()
            processor(0, logits, [[3, 4] + [7] * step], None, None)
            assert logits[0, 0, 5] == -torch.inf and torch.equal(logits[0, 0, 6:], raw[0, 0, 6:])
            assert [_forced_only(row[0]) for row in logits[1:]] == [EOS, EOS]
    assert len([r for r in caplog.records if "draft row" in r.getMessage()]) == 1 and not FAILURES


def test_a_call_that_cannot_be_read_before_realization_ends_the_request_with_its_end_id():
    processor = _params([10, 11]).logits_processor
    logits = torch.randn(1, 4, VOCAB)
    processor(0, logits, [[3]] * 3, None, None)  # 4 beams of logits, token lists for 3: unreadable
    assert [_forced_only(row) for row in logits[0]] == [EOS] * 4
    assert len(FAILURES) == 1 and f"ending the request with stop token {EOS}" in FAILURES[0]


def test_end_id_filled_in_after_activation_is_the_stop_token():
    params = SamplingParamsStandIn()
    activate(params, [ForcedTokenSequenceSpec(token_ids=(10,), eos_token_id=EOS)], vocab_size=VOCAB)
    params.end_id = 7  # TensorRT-LLM's generate_async fills end_id from the tokenizer, after activate
    processor = pickle.loads(pickle.dumps(params)).logits_processor
    logits = torch.randn(2, 2, VOCAB)  # no layout TensorRT-LLM uses for 3 beams
    processor(0, logits, [[3]] * 3, None, None)
    assert all(_forced_only(logits[i, j]) == 7 for i in range(2) for j in range(2))


def test_activate_stamps_the_arrival_the_executors_factory_is_told():
    """The worker's ``activate`` stamps when the request arrived (now, unless given); the processor
    pickled into the executor realizes with it, with the prompt and stop ids TensorRT-LLM holds."""
    from dynlogits.testing import plugin_factories, plugin_kinds

    with plugin_kinds.registered(), plugin_factories.recording() as seen:
        before = time.time()
        stamped = SamplingParamsStandIn(stop_token_ids=[9, 4])
        processor = activate(stamped, [plugin_kinds.FactsSpec(tag="now")], vocab_size=VOCAB)
        assert processor is not None and before <= processor.arrival_time <= time.time()
        given = SamplingParamsStandIn()
        activate(given, [plugin_kinds.FactsSpec(tag="given")], vocab_size=VOCAB, arrival_time=5.0)
        stamped.end_id = given.end_id = 7  # filled by the LLM API after activate
        for params in (stamped, given):
            executor_copy = pickle.loads(pickle.dumps(params)).logits_processor
            executor_copy(0, torch.zeros(1, 1, VOCAB), [[3, 4, 5]], None, None)
        [now], [five] = seen["now"], seen["given"]
    assert (now.arrival_time, now.prompt_ids, now.stop_token_ids) == (processor.arrival_time, (3, 4, 5), (7, 4, 9))
    assert (five.arrival_time, five.stop_token_ids) == (5.0, (7,))


def test_logits_of_another_width_than_validated_fail_only_that_request():
    processor = _params([10]).logits_processor
    logits = torch.randn(1, 1, VOCAB // 2)  # e.g. vocabulary-sharded logits
    processor(0, logits, [[3]], None, None)
    assert _forced_only(logits[0, 0]) == EOS and "validated for a vocabulary of 48" in FAILURES[0]


# -- positions ----------------------------------------------------------------------------------------
def test_the_prompt_length_is_what_the_engine_holds_at_the_first_call():
    harness = PytorchBackendHarness()
    engine_prompt = [0, 3, 4] + [99] * 6  # the engine inserted a BOS and expanded an image placeholder
    harness.add(0, engine_prompt, _params([10, 11, 12]))
    assert _drive(harness, {0: 1}, 4, _forced_only)[0] == [[10, 11, 12, EOS]]


def test_a_request_arriving_with_generated_tokens_continues_after_them():
    harness = TrtBackendHarness()  # the decode side of a disaggregated request: the prefill's first token
    harness.add(0, [3, 4], _params([10, 11, 12], generated_before=1), generated=[[10]])
    assert _drive(harness, {0: 1}, 3, _forced_only)[0] == [[11, 12, EOS]]


def test_n_samples_get_their_own_processor_copies():
    harness = PytorchBackendHarness()
    harness.add(0, [3], _params([10, 11, 12]))
    harness.add_sample(1, parent=0)
    assert harness.requests[0].processors[0] is not harness.requests[1].processors[0]
    harness.step({0: torch.randn(VOCAB)})
    harness.commit(0, [10])  # only the parent advanced; the sample starts at its own position
    rows = harness.step({0: torch.randn(VOCAB), 1: torch.randn(VOCAB)})
    assert (_forced_only(rows[0][0]), _forced_only(rows[1][0])) == (11, 10)


# -- failures stay with their request -----------------------------------------------------------------
def test_a_raising_processor_fails_only_its_request_and_never_reaches_the_engine(monkeypatch):
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    harness = PytorchBackendHarness()
    bad = [PythonProcessorSpec(factory=RAISE_AFTER_FACTORY, kwargs={"after": 1})]
    harness.add(0, [3], _params(entries=bad), beam_width=2)
    harness.add(1, [3], _params([10, 11, 12, 13]), beam_width=2)
    out = _drive(harness, {0: 2, 1: 2}, 4, lambda row: int(row.argmax()))
    assert out[0][0][1:] == [EOS, EOS, EOS] and out[0][1][1:] == [EOS, EOS, EOS]
    assert out[1] == [[10, 11, 12, 13]] * 2
    assert len(FAILURES) == 1 and "injected fault" in FAILURES[0]


@pytest.mark.parametrize("harness_type", [PytorchBackendHarness, TrtBackendHarness])
def test_an_engine_object_missing_what_the_adapter_reads_fails_only_that_request(harness_type):
    harness = harness_type()
    harness.add(0, [3], _params([10, 11, 12]))
    harness.add(1, [3], _params([20, 21, 22]))
    harness.break_reads(0)  # its token lists become objects without a length or items
    out = _drive(harness, {0: 1, 1: 1}, 3, _forced_only)
    assert out == {0: [[EOS, EOS, EOS]], 1: [[20, 21, 22]]}
    assert len(FAILURES) == 1 and "TypeError" in FAILURES[0]


def test_logits_that_are_not_a_tensor_are_reported_not_raised():
    processor = _params([10]).logits_processor
    processor(0, object(), [[3]], 12345, None)  # a different engine version's object: no .ndim, no .is_cuda
    assert len(FAILURES) == 1 and "AttributeError" in FAILURES[0]


# -- the batched callback -----------------------------------------------------------------------------
@pytest.mark.parametrize("beams", [1, 4])
def test_batched_callback_applies_each_registered_request_and_leaves_non_opted_in_rows(beams):
    batched = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=EOS)
    harness = TrtBackendHarness(batched, llm_api=False)  # the executor API in this process
    seqs = {0: [10, 11, 12], 1: [20, 21, 22]}
    for r, ids in seqs.items():
        params = _params(ids)
        batched.register(100 + r, params.logits_processor)
        params.logits_processor, params.apply_batched_logits_processor = None, True
        harness.add(r, [3], params, beam_width=beams, client_id=100 + r)
    harness.add(9, [3], SamplingParamsStandIn(), beam_width=beams, client_id=109)  # did not opt in
    raw = []
    out = _drive(harness, {**{r: beams for r in seqs}, 9: beams}, 4,
                 lambda row: _forced_only(row) if torch.isinf(row).any() else raw.append(1) or 2)
    assert all(out[r] == [ids + [EOS]] * beams for r, ids in seqs.items())
    assert len(raw) == 4 * beams and not FAILURES  # every row of the request that did not opt in was left as it was
    batched.unregister(100)
    assert len(batched) == 1


def test_an_opted_in_request_without_a_registered_processor_is_fail_stopped_and_reported():
    batched = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=EOS)
    harness = TrtBackendHarness(batched, llm_api=False)
    good = _params([10, 11])
    batched.register(1, good.logits_processor)
    good.logits_processor, good.apply_batched_logits_processor = None, True
    harness.add(0, [3], good, client_id=1)
    harness.add(1, [3], SamplingParamsStandIn(apply_batched_logits_processor=True), client_id=2)  # never registered
    assert _drive(harness, {0: 1, 1: 1}, 3, _forced_only) == {0: [[10, 11, EOS]], 1: [[EOS, EOS, EOS]]}
    assert len(FAILURES) == 1 and "client id 2, but no processor was registered" in FAILURES[0]


def test_an_opted_in_request_without_a_client_id_is_reported_once_not_every_step():
    batched = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=EOS)
    for _ in range(3):
        logits = [torch.randn(1, 1, VOCAB)]
        batched([7], logits, [[[3]]], None, [None])
        assert _forced_only(logits[0][0, 0]) == EOS
    assert len(FAILURES) == 1 and "carries no client id" in FAILURES[0]


def test_a_request_with_its_own_processor_is_not_in_the_batched_call_so_activate_refuses_both():
    with pytest.raises(ValueError, match="never both"):
        _params([10], apply_batched_logits_processor=True)
    calls = []
    harness = TrtBackendHarness(lambda *args: calls.append(args[0]), llm_api=False)
    own = _params([10])
    own.apply_batched_logits_processor = True
    harness.add(0, [3], own, client_id=1)
    harness.add(1, [3], SamplingParamsStandIn(apply_batched_logits_processor=True), client_id=2)
    harness.step({0: torch.randn(VOCAB), 1: torch.randn(VOCAB)})
    assert calls == [[1]]  # LogitsPostProcessor: the per-request processor, else the batched one


def test_a_batched_call_whose_lists_disagree_fails_only_the_unreadable_request():
    batched = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=EOS)
    batched.register(1, _params([10]).logits_processor)
    batched.register(2, _params([20]).logits_processor)
    logits = [torch.randn(1, 1, VOCAB), torch.randn(1, 1, VOCAB)]
    batched([0, 1], logits, [[[3]]], None, [1, 2])  # token lists for one request only
    assert (_forced_only(logits[0][0, 0]), _forced_only(logits[1][0, 0])) == (10, EOS)
    assert len(FAILURES) == 1 and "IndexError" in FAILURES[0]


def test_the_batched_processor_refuses_the_llm_api():
    batched = DynamoTrtllmBatchedLogitsProcessor(stop_token_id=EOS)
    with pytest.raises(TypeError, match="cannot be used through TensorRT-LLM's LLM API"):
        TrtBackendHarness(batched)  # the LLM hands it to its executor worker pickled
    with pytest.raises(UnsupportedEngineConfig) as refused:
        check_llm_args({"backend": "tensorrt", "batched_logits_processor": batched})
    assert str(refused.value) == NOT_THROUGH_LLM_API


# -- activation and pickling -----------------------------------------------------------------------------
def test_processors_pickle_and_load_by_module_path_in_a_fresh_process():
    processor = _params([10, 11, 12]).logits_processor
    script = ("import pickle, sys, torch; p = pickle.loads(sys.stdin.buffer.read()); x = torch.zeros(1, 1, 48); "
              "p(0, torch.zeros(1, 1, 48), [[3, 4]], None, None); p(0, x, [[3, 4, 10]], None, None); "
              "print(type(p).__module__, int(x.argmax()))")
    proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(processor), capture_output=True, timeout=300)
    assert proc.stdout.decode().split() == ["dynlogits.adapters.trtllm.processor", "11"], proc.stderr.decode()[-2000:]


def test_the_processor_class_is_added_to_each_tensorrt_llm_allow_list_present(monkeypatch):
    approved: list[type] = []
    monkeypatch.setitem(sys.modules, "tensorrt_llm", types.ModuleType("tensorrt_llm"))
    monkeypatch.setitem(sys.modules, "tensorrt_llm.serialization",
                        types.SimpleNamespace(register_approved_class=approved.append))
    from dynlogits.adapters.trtllm import DynamoTrtllmLogitsProcessor

    assert register_ipc_classes(DynamoTrtllmLogitsProcessor) == ["tensorrt_llm.serialization.register_approved_class"]
    assert approved == [DynamoTrtllmLogitsProcessor]


def test_attach_makes_a_fresh_processor_per_request_and_keeps_other_processors():
    other = object()
    params = SamplingParamsStandIn(end_id=EOS, logits_processor=[other])
    entries = [ForcedTokenSequenceSpec(token_ids=(5,), eos_token_id=EOS)]
    first = activate(params, entries)
    second = activate(params, entries)
    assert params.logits_processor == [other, second] and first is not second
    assert activate(params, []) is None and params.logits_processor == other


def test_python_entries_need_the_workers_allow_list_and_realize_from_their_import_string(monkeypatch):
    entries = [PythonProcessorSpec(factory="dynlogits.testing.faults:scale", kwargs={"scale": 3.0})]
    monkeypatch.delenv(PYTHON_FACTORIES_ENV, raising=False)
    with pytest.raises(SpecError, match="allow-listed"):
        activate(SamplingParamsStandIn(), entries)
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, "dynlogits.testing.faults:scale")
    processor = pickle.loads(pickle.dumps(_params(entries=entries))).logits_processor
    logits = torch.ones(1, 1, VOCAB)
    processor(0, logits, [[3]], None, None)
    assert torch.equal(logits, torch.full((1, 1, VOCAB), 3.0))


def test_bad_payload_is_refused_at_attach_naming_the_field():
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\].token_ids\[0\]"):
        activate(SamplingParamsStandIn(), [ForcedTokenSequenceSpec(token_ids=(VOCAB,), eos_token_id=EOS)],
                 vocab_size=VOCAB)


# -- configurations refused up front ---------------------------------------------------------------------
def test_the_overlap_scheduler_is_refused_on_the_pytorch_backend():
    with pytest.raises(UnsupportedEngineConfig, match="disable_overlap_scheduler"):
        check_llm_args({})
    check_llm_args({"disable_overlap_scheduler": True})
    check_llm_args({"backend": "tensorrt"})


@pytest.mark.parametrize("backend", ["pytorch", "tensorrt"])
def test_speculative_decoding_is_refused(backend):
    with pytest.raises(UnsupportedEngineConfig, match="speculative_config"):
        check_llm_args({"backend": backend, "disable_overlap_scheduler": True, "speculative_config": object()})


def test_beam_search_is_refused_on_pytorch_backends_older_than_the_proven_layout():
    args = {"disable_overlap_scheduler": True, "max_beam_width": 4}
    with pytest.raises(UnsupportedEngineConfig, match=r"TensorRT-LLM >= 1\.3\.0rc29.*PR 16010"):
        check_llm_args(args, tensorrt_llm_version="1.3.0rc20")
    check_llm_args(args, tensorrt_llm_version="1.3.0rc29")
    check_llm_args({**args, "max_beam_width": 1}, tensorrt_llm_version="1.2.1")
    check_llm_args({**args, "backend": "tensorrt"}, tensorrt_llm_version="1.2.1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine: the stream_ptr path needs CUDA")
def test_stream_ptr_work_is_enqueued_on_the_given_cuda_stream():
    processor = _params([10, 11]).logits_processor
    stream = torch.cuda.Stream()
    logits = torch.randn(1, 1, VOCAB, device="cuda")
    processor(0, logits, [[3]], stream.cuda_stream, None)
    stream.synchronize()
    assert int(logits.argmax()) == 10


def test_conformance_command_passes_for_trtllm_on_every_logits_layout_and_names_the_version():
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "conformance", "trtllm"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    headers = [line for line in proc.stdout.splitlines() if line.startswith("adapter trtllm / driver")]
    assert len(headers) == 5 and all("harness" in h and "TensorRT-LLM 1.3.0rc29" in h for h in headers)
    for layout in ("[1, 1, vocab]", "[4, 1, vocab]", "[1, 4, vocab]", "[1 + 2, 1, vocab]"):
        assert any(layout in h for h in headers), layout
    assert proc.stdout.splitlines()[-1] == f"{5 * len(CHECKS)} passed, 0 failed"
