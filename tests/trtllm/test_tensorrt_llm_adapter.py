"""The TensorRT-LLM adapter, driven with TensorRT-LLM's documented shapes and call patterns.

TensorRT-LLM itself is **not installed** (its wheel is not on the package index reachable here, only a
stub that downloads it from NVIDIA's own index, and it needs CUDA): the harnesses in
``dynlogits.adapters.trtllm.harness`` are modelled on its PyTorch backend's call site
(``_execute_logit_post_processors``: a view in, return ignored, row written back) and its TensorRT
backend's batched callback, including its rule that a processor exception fails every request.

Named ``test_tensorrt_llm_*``: the ai-dynamo reference (installed for the compatibility tests) registers a
pytest plugin that silently skips ``test_trtllm_*.py`` files when ``tensorrt_llm`` is missing."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch

from dynlogits.adapters.trtllm import (
    FAILURES,
    DynamoTrtllmBatchedLogitsProcessor,
    DynamoTrtllmLogitsProcessor,
    UnsupportedEngineConfig,
    activate,
    check_llm_args,
)
from dynlogits.adapters.trtllm.harness import PytorchBackendHarness, SamplingParamsStandIn, TrtBackendBatchedHarness
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.specs import ForcedTokenSequenceSpec, PythonProcessorSpec, SpecError
from dynlogits.testing.faults import RAISE_AFTER_FACTORY
from dynlogits.testing import CHECKS

VOCAB = 48
EOS = 1


def _attach(ids, prompt, *, entries=None):
    params = SamplingParamsStandIn(end_id=EOS)
    entries = entries if entries is not None else [ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=EOS)]
    activate(params, entries, prompt, vocab_size=VOCAB)
    return pickle.loads(pickle.dumps(params))  # the request reaches the executor pickled


def _forced_only(row: torch.Tensor) -> int:
    finite = torch.isfinite(row).nonzero().flatten().tolist()
    assert len(finite) == 1, finite
    return finite[0]


def _drive(harness, widths: dict[int, int], steps: int, pick) -> dict[int, list[list[int]]]:
    """Run ``steps`` steps over all requests; ``pick(row)`` chooses each beam's token."""
    out = {r: [[] for _ in range(w)] for r, w in widths.items()}
    for step in range(steps):
        order = list(widths)[::-1] if step % 2 else list(widths)  # interleaved, order changing
        rows = sum(harness.rows_of(r) for r in order)
        logits = harness.step(order, torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(step)))
        offset = 0
        for r in order:
            n = harness.rows_of(r)
            tokens = [pick(logits[offset + b]) for b in range(n)] * (widths[r] // n)
            harness.commit(r, tokens)
            for b in range(widths[r]):
                out[r][b].append(tokens[b])
            offset += n
    return out


@pytest.mark.parametrize("beams", [1, 4])
def test_pytorch_backend_beams_each_follow_their_own_history(beams):
    harness = PytorchBackendHarness("beam")
    seqs = {0: [10, 11, 12, 13], 1: [20, 21, 22, 23], 2: [30, 31, 32, 33]}
    for r, ids in seqs.items():
        harness.add(r, [3, 4 + r], _attach(ids, [3, 4 + r]), beam_width=beams)
    out = _drive(harness, {r: beams for r in seqs}, 5, _forced_only)
    for r, ids in seqs.items():
        assert out[r] == [ids + [EOS]] * beams


def test_beams_with_different_histories_get_different_positions():
    harness = PytorchBackendHarness("beam")
    harness.add(7, [3], _attach([10, 11, 12, 13], [3]), generated=[[10], [10, 11, 12], [], [10, 11]])
    logits = harness.step([7], torch.randn(4, VOCAB))
    assert [_forced_only(row) for row in logits] == [11, 13, 10, 12]


def test_pytorch_backend_1_2_layout_writes_the_row_back_for_interleaved_requests():
    harness = PytorchBackendHarness("1.2")
    seqs = {0: [10, 11, 12], 1: [20, 21, 22], 2: [30, 31, 32]}
    for r, ids in seqs.items():
        harness.add(r, [3] * (r + 1), _attach(ids, [3] * (r + 1)))
    out = _drive(harness, {r: 1 for r in seqs}, 4, _forced_only)
    assert {r: o[0] for r, o in out.items()} == {r: ids + [EOS] for r, ids in seqs.items()}


@pytest.mark.parametrize("beams", [1, 4])
def test_tensorrt_backend_batched_callback_applies_all_registered_requests(beams):
    batched = DynamoTrtllmBatchedLogitsProcessor()
    harness = TrtBackendBatchedHarness(batched, stream_ptr=0)
    seqs = {0: [10, 11, 12], 1: [20, 21, 22]}
    for r, ids in seqs.items():
        batched.register(r, _attach(ids, [3]).logits_processor)
        harness.add(r, [3], SamplingParamsStandIn(apply_batched_logits_processor=True), beam_width=beams, client_id=r)
    harness.add(9, [3], SamplingParamsStandIn(), beam_width=beams, client_id=9)  # not registered: untouched
    raw = []
    out = _drive(harness, {**{r: beams for r in seqs}, 9: beams}, 4,
                 lambda row: _forced_only(row) if torch.isinf(row).any() else raw.append(1) or 2)
    assert all(out[r] == [ids + [EOS]] * beams for r, ids in seqs.items())
    assert len(raw) == 1 + 3 * beams  # every row of the unregistered request was left as it was
    batched.unregister(0)
    assert len(batched) == 1


def test_a_raising_processor_fails_only_its_request_and_never_reaches_the_engine(monkeypatch):
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    FAILURES.clear()
    harness = PytorchBackendHarness("beam")
    bad = [PythonProcessorSpec(factory=RAISE_AFTER_FACTORY, kwargs={"after": 1})]
    harness.add(0, [3], _attach(None, [3], entries=bad), beam_width=2)
    harness.add(1, [3], _attach([10, 11, 12, 13], [3]), beam_width=2)
    out = _drive(harness, {0: 2, 1: 2}, 4, lambda row: int(row.argmax()))
    assert out[0][0][1:] == [EOS, EOS, EOS] and out[0][1][1:] == [EOS, EOS, EOS]
    assert out[1] == [[10, 11, 12, 13]] * 2
    assert len(FAILURES) == 1 and "injected fault" in FAILURES[0]


def test_a_call_with_mismatched_beams_fail_stops_the_request_instead_of_raising():
    FAILURES.clear()
    processor = _attach([10, 11], [3]).logits_processor
    logits = torch.randn(2, 1, VOCAB)
    processor(5, logits, [[3]], None, None)  # two rows, one token list
    assert [_forced_only(row[0]) for row in logits] == [EOS, EOS] and len(FAILURES) == 1


def test_processors_pickle_and_load_by_module_path_in_a_fresh_process():
    processor = _attach([10, 11, 12], [3, 4]).logits_processor
    script = ("import pickle, sys, torch; p = pickle.loads(sys.stdin.buffer.read()); "
              "x = torch.zeros(1, 1, 48); p(0, x, [[3, 4, 10]], None, None); "
              "print(type(p).__module__, int(x.argmax()))")
    proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(processor), capture_output=True, timeout=300)
    assert proc.stdout.decode().split() == ["dynlogits.adapters.trtllm.processor", "11"], proc.stderr.decode()[-2000:]


def test_attach_makes_a_fresh_processor_per_request_and_keeps_other_processors():
    other = object()
    params = SamplingParamsStandIn(end_id=EOS, logits_processor=[other])
    entries = [ForcedTokenSequenceSpec(token_ids=(5,), eos_token_id=EOS)]
    first = activate(params, entries, [3])
    second = activate(params, entries, [3, 4])
    assert params.logits_processor == [other, second] and first is not second and second.prompt_len == 2
    assert activate(params, [], [3]) is None and params.logits_processor == other


def test_python_entries_need_the_workers_allow_list_and_realize_from_their_import_string(monkeypatch):
    entries = [PythonProcessorSpec(factory="dynlogits.testing.faults:scale", kwargs={"scale": 3.0})]
    monkeypatch.delenv(PYTHON_FACTORIES_ENV, raising=False)
    with pytest.raises(SpecError, match="allow-listed"):
        activate(SamplingParamsStandIn(), entries, [3])
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, "dynlogits.testing.faults:scale")
    params = _attach(None, [3], entries=entries)
    logits = torch.ones(1, 1, VOCAB)
    params.logits_processor(0, logits, [[3]], None, None)
    assert torch.equal(logits, torch.full((1, 1, VOCAB), 3.0))


def test_bad_payload_is_refused_at_attach_naming_the_field():
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\].token_ids\[0\]"):
        activate(SamplingParamsStandIn(), [ForcedTokenSequenceSpec(token_ids=(VOCAB,), eos_token_id=EOS)],
                                 [3], vocab_size=VOCAB)


def test_overlap_scheduler_is_refused_on_the_pytorch_backend():
    with pytest.raises(UnsupportedEngineConfig, match="disable_overlap_scheduler"):
        check_llm_args({})
    check_llm_args({"disable_overlap_scheduler": True})
    check_llm_args({"backend": "tensorrt"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine: the stream_ptr path needs CUDA")
def test_stream_ptr_work_is_enqueued_on_the_given_cuda_stream():
    processor = _attach([10, 11], [3]).logits_processor
    stream = torch.cuda.Stream()
    logits = torch.randn(1, 1, VOCAB, device="cuda")
    processor(0, logits, [[3]], stream.cuda_stream, None)
    stream.synchronize()
    assert int(logits.argmax()) == 10


def test_conformance_command_passes_for_trtllm_and_says_it_is_a_harness():
    proc = subprocess.run([sys.executable, "-m", "dynlogits.cli", "conformance", "trtllm"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any("driver trtllm-pytorch: TensorRT-LLM not installed" in line and "harness" in line for line in lines)
    assert lines[-1] == f"{2 * len(CHECKS)} passed, 0 failed"  # two drivers, every check
