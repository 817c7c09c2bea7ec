"""The adapter under Model Runner V2, driven through vLLM's real V2 classes.

Not end to end, on purpose: Model Runner V2 needs Triton kernels and this machine's vLLM CPU
build has no Triton CPU backend (``VllmConfig.use_v2_model_runner`` falls back to the V1 runner),
and the runner's buffers need pinned memory, which needs an accelerator. So
``dynlogits.adapters.vllm.harness.V2SamplerHarness`` drives the processor exactly as the V2
runner and ``Sampler.apply_sampling_params`` do — vLLM's real ``LogitsProcRequestState`` and
``LogitsContext``, slots from a free list that are reused without a removal call,
``add_request`` after the request state is written, one logits row per draft token, the skip when
no request needs processing, the float32 copy — with plain tensors behind the ``.gpu``/``.np``
buffer attributes. vLLM's own V2 loader and admission validator are exercised for real.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch

pytest.importorskip("vllm")

from pydantic import BaseModel, ConfigDict  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsProcRequestState,
    build_custom_logits_processors,
)

from dynlogits.adapters.vllm import PROCESSOR_FQCN, DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import HostBuffer, V2SamplerHarness  # noqa: E402
from dynlogits.specs import (  # noqa: E402
    WIRE_KEY,
    SpecError,
    kinds,  # noqa: E402
)
from dynlogits.specs.kinds import ProcessorKind  # noqa: E402

VOCAB = 64
EOS = 1


def sp(payload: Any = None) -> SamplingParams:
    params = SamplingParams(temperature=0.0, extra_args=None if payload is None else {WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def forced(*ids: int) -> list[dict[str, Any]]:
    return [{"kind": "forced_sequence", "token_ids": list(ids), "eos_token_id": EOS}]


# A kind that records the history each call sees (registered in this process only).
SEEN: list[list[int]] = []


class RecordHistorySpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["test_record_history"] = "test_record_history"


class _Record:
    def __call__(self, input_ids, logits):
        SEEN.append(list(input_ids))


RECORD_KIND = ProcessorKind("test_record_history", RecordHistorySpec, lambda entry, ctx: _Record())
RECORD = [{"kind": "test_record_history"}]


@pytest.fixture(autouse=True)
def record_kind_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recording kind exists only while this module's tests run (it would otherwise join
    every other test's kind list, e.g. the golden unknown-kind message)."""
    monkeypatch.setattr(kinds, "_registered", {**kinds._registered, RECORD_KIND.kind: RECORD_KIND})


@pytest.fixture
def harness() -> V2SamplerHarness:
    SEEN.clear()
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4)


def test_vllms_v2_loader_builds_the_same_class_from_its_import_string():
    class FakeRunnerState:  # only the attributes from_request_state reads; buffers need an accelerator
        device = torch.device("cpu")
        max_num_reqs = 4
        vocab_size = VOCAB
        all_token_ids = HostBuffer((4, 16))
        prompt_len = prefill_len = total_len = HostBuffer(4)

    (proc,) = build_custom_logits_processors(None, FakeRunnerState(), False, (PROCESSOR_FQCN,))  # type: ignore[arg-type]
    assert isinstance(proc, DynamoVllmLogitsProcessor) and proc.runner == "v2" and proc.vocab_size == VOCAB
    assert isinstance(proc._req_states, LogitsProcRequestState)


def test_add_request_says_whether_the_request_needs_processing(harness):
    assert harness.add_request("plain", [3, 4], sp()) is not None
    assert not harness.needs_processing[harness.reqs["plain"].slot]
    harness.add_request("forced", [3], sp(forced(7)))
    assert harness.needs_processing[harness.reqs["forced"].slot]


def test_admission_rejects_a_malformed_payload_naming_the_field(harness):
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.token_ids\[0\]: must be >= 0"):
        harness.add_request("bad", [3], sp(forced(-1)))


def test_forced_requests_in_one_batch_each_get_their_own_sequence(harness):
    harness.add_request("a", [2, 3], sp(forced(10, 11, 12)))
    harness.add_request("plain", [2], sp())
    harness.add_request("b", [9, 9, 9], sp(forced(20, 21)))
    for step in range(4):
        batch = ["b", "plain", "a"] if step % 2 else ["a", "b", "plain"]  # rows reorder every step
        harness.greedy_step(batch, seed=step)
    assert harness.output_ids("a") == [10, 11, 12, EOS]
    assert harness.output_ids("b")[:3] == [20, 21, EOS]


def test_rows_without_a_payload_are_untouched(harness):
    harness.add_request("forced", [2], sp(forced(10)))
    harness.add_request("plain", [2], sp())
    logits = torch.randn(2, VOCAB)
    out = harness.step(["plain", "forced"], logits)
    assert torch.equal(out[0], logits[0])
    assert int(out[1].argmax()) == 10
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [10] and out[1, 10] == 0.0  # the rest masked


def test_under_return_sampling_mask_a_forced_rows_support_is_its_forced_token() -> None:
    """With ``return_sampling_mask`` on, the V2 sampler reports each sample's support as the finite
    ids of the processed logits (``SamplingMaskTensors.from_logits``, vLLM 0.32
    ``v1/worker/gpu/sample/output.py``): a forced row's support must be the forced token alone,
    whatever the other ids held (sampling parameters that ask for replay: temperature and top-k)."""
    from types import SimpleNamespace

    config = SimpleNamespace(speculative_config=None, use_v2_model_runner=True,
                             model_config=SimpleNamespace(return_sampling_mask=True, logprobs_mode="raw_logprobs"))
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4, vllm_config=config)
    params = SamplingParams(temperature=0.7, top_k=5, extra_args={WIRE_KEY: forced(10, 11)})
    params.update_from_generation_config({}, eos_token_id=EOS)
    harness.add_request("forced", [2], params)
    out = harness.step(["forced"], torch.randn(1, VOCAB))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [10]


def test_a_batch_without_payloads_is_skipped_without_reading_state(harness):
    harness.add_request("plain", [2], sp())
    logits = torch.randn(1, VOCAB)
    assert harness.step(["plain"], logits) is logits  # the sampler's own skip: apply() not called


def test_a_reused_slot_starts_from_a_clean_state(harness):
    harness.add_request("first", [2], sp(forced(10, 11)))
    harness.greedy_step(["first"])
    slot = harness.reqs["first"].slot
    harness.remove_request("first")  # V2 does not tell processors; the next add overwrites

    assert harness.add_request("plain", [5], sp()) == slot
    assert not harness.needs_processing[slot]
    logits = torch.randn(1, VOCAB)
    assert torch.equal(harness.step(["plain"], logits.clone()), logits)
    harness.remove_request("plain")

    assert harness.add_request("second", [5, 6, 7], sp(forced(30, 31))) == slot
    for step in range(3):
        harness.greedy_step(["second"], seed=step)
    assert harness.output_ids("second") == [30, 31, EOS]  # from position 0 again


def test_each_draft_row_sees_the_history_plus_the_drafts_before_it(harness):
    """Speculative decoding: one row per draft token, each with its own visible history."""
    harness.add_request("spec", [2, 3], sp(RECORD + forced(10, 11, 12)), output_ids=[10])
    harness.add_request("plain", [4], sp())
    logits = harness.step(["plain", "spec"], torch.randn(2 + 3, VOCAB), drafts={"spec": [11, 99], "plain": [5]})
    assert SEEN == [[10], [10, 11], [10, 11, 99]]
    # rows: plain(local 0), plain(local 1), spec(local 0..2)
    assert [int(logits[r].argmax()) for r in (2, 3, 4)] == [11, 12, EOS]


def test_resumption_after_preemption_continues_the_forced_sequence(harness):
    """V2 re-adds a preempted request with its generated tokens in the prefill."""
    harness.add_request("resumed", [2, 3], sp(forced(10, 11, 12, 13)), output_ids=[10, 11])
    harness.greedy_step(["resumed"])
    harness.greedy_step(["resumed"])
    assert harness.output_ids("resumed") == [10, 11, 12, 13]


def test_a_raising_processor_ends_only_its_own_request(harness, monkeypatch):
    from dynlogits.adapters.vllm.harness import RAISE_AFTER_FACTORY
    from dynlogits.processors.registry import PYTHON_FACTORIES_ENV

    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    faulty = [{"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 1}}]
    harness.add_request("faulty", [2], sp(faulty))
    harness.add_request("ok", [2], sp(forced(10, 11)))
    for step in range(3):
        harness.greedy_step(["faulty", "ok"], seed=step)
    faulty_out = harness.output_ids("faulty")
    assert faulty_out[1:] == [EOS, EOS]  # first token free, then fail-stopped at the stop token
    assert harness.output_ids("ok") == [10, 11, EOS]
    (failure,) = harness.processor.failures
    assert "injected fault after 1 tokens" in failure and f"stop token {EOS}" in failure


def test_an_id_beyond_the_logits_width_fails_that_request_at_add_time(harness):
    harness.add_request("wide", [2], sp([{"kind": "banned_tokens", "token_ids": [VOCAB + 5]}]))
    harness.add_request("ok", [2], sp(forced(10)))
    out = harness.step(["wide", "ok"], torch.randn(2, VOCAB))
    assert int(out[0].argmax()) == EOS and int(out[1].argmax()) == 10
    assert "must be < vocab size 64" in harness.processor.failures[0]


def test_apply_edits_the_batch_tensor_in_place(harness):
    harness.add_request("forced", [2], sp(forced(10)))
    logits = torch.randn(1, VOCAB)
    ctx = harness.context(["forced"], {})
    out = harness.processor.apply(logits, ctx)
    assert out is logits and torch.isfinite(logits[0]).nonzero().flatten().tolist() == [10]


# -- speculative decoding: drafts, placeholders, failures on draft rows ---------------------------
def test_placeholder_drafts_never_reach_a_processor(harness):
    """Drafts of a request still in prefill are -1 placeholders; their rows are discarded by the
    runner and left untouched, so no processor ever sees a -1."""
    harness.add_request("spec", [2, 3], sp(RECORD), output_ids=[10])
    logits = torch.randn(3, VOCAB)
    out = harness.step(["spec"], logits.clone(), drafts={"spec": [-1, -1]})
    assert SEEN == [[10]]
    assert torch.equal(out[1:], logits[1:])


def test_a_failure_on_a_draft_row_stops_that_row_and_not_the_request(harness, monkeypatch):
    from dynlogits.adapters.vllm.harness import RAISE_AFTER_FACTORY
    from dynlogits.processors.registry import PYTHON_FACTORIES_ENV

    monkeypatch.setenv(PYTHON_FACTORIES_ENV, RAISE_AFTER_FACTORY)
    faulty = [{"kind": "python", "factory": RAISE_AFTER_FACTORY, "kwargs": {"after": 2}}]
    harness.add_request("spec", [2], sp(faulty), output_ids=[10])
    out = harness.step(["spec"], torch.zeros(2, VOCAB), drafts={"spec": [11]})
    assert torch.isfinite(out[0]).all()  # history [10]: fine
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [EOS]  # history [10, 11]: raised, row stopped
    assert not harness.processor.failures  # the draft may be rejected: the request has not failed
    harness.commit("spec", [12])  # the draft was rejected; the committed row goes on
    out = harness.step(["spec"], torch.zeros(1, VOCAB))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [EOS]  # history [10, 12]: now it fails
    assert len(harness.processor.failures) == 1


def test_resident_forced_rows_under_drafts_follow_each_rows_position(harness):
    harness.add_request("a", [2, 3], sp(forced(10, 11, 12)), output_ids=[10])
    harness.add_request("b", [4], sp(forced(20, 21)))
    out = harness.step(["b", "a"], torch.randn(2 + 3, VOCAB), drafts={"b": [20], "a": [11, 12]})
    # rows: b(0), b(1), a(0), a(1), a(2)
    assert [int(out[r].argmax()) for r in range(5)] == [20, 21, 11, 12, EOS]
    assert all(int(torch.isfinite(out[r]).sum()) == 1 for r in range(5))


def test_thinking_budget_is_followed_on_the_device_through_drafts_and_steps(harness):
    """start [30], end [31, 32], budget 2: two tokens after 30 the span closes with 31 then 32,
    whether the tokens arrive as committed tokens or as drafts before a row."""
    payload = [{"kind": "thinking_budget", "start_token_ids": [30], "end_token_ids": [31, 32], "budget": 2}]
    harness.add_request("t", [2], sp(payload), output_ids=[5])
    request = harness.processor._slots[harness.reqs["t"].slot]
    assert request is not None and request.resident  # the device path, not a read-back of histories
    out = harness.step(["t"], torch.zeros(3, VOCAB), drafts={"t": [30, 7]})
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()  # span not open / 0 tokens in it
    assert torch.isfinite(out[2]).all()  # 1 token inside the span
    harness.commit("t", [30, 7, 8])  # drafts accepted plus the bonus token: 2 tokens inside the span
    out = harness.step(["t"], torch.zeros(2, VOCAB), drafts={"t": [31]})
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [31]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [32]  # continues the end sequence
    harness.commit("t", [31, 32])
    out = harness.step(["t"], torch.zeros(1, VOCAB))
    assert torch.isfinite(out[0]).all()  # the span is closed: free again


@pytest.mark.parametrize(("prompt", "output", "budget"), [
    ([2], [30, 5, 6], 3),  # resumed: 2 tokens inside a span its output opened
    ([2, 30, 9], [7] * 3, 5),  # 1 + 3 inside a span its prompt opened, followed on the device
    ([2, 30, 9], [7] * 40, 42),  # the same past MAX_DEVICE_CATCH_UP: scanned once on the host
])
def test_a_resumed_request_continues_its_thinking_span(harness, prompt, output, budget):
    payload = [{"kind": "thinking_budget", "start_token_ids": [30], "end_token_ids": [31], "budget": budget}]
    harness.add_request("t", prompt, sp(payload), output_ids=output)  # one token short of the budget
    out = harness.step(["t"], torch.zeros(1, VOCAB))
    assert torch.isfinite(out[0]).all()
    harness.commit("t", [7])
    out = harness.step(["t"], torch.zeros(1, VOCAB))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [31]


def test_a_thinking_span_the_prompt_left_open_counts_its_prompt_tokens_on_the_device(harness):
    """DeepSeek-R1 style: the prompt ends inside a span (``... 30 9``); its token after the start tag
    counts, so a budget of 3 forces the end after two generated tokens; the prompt's last token and
    the first generated one make a two-token start tag too (``... 40`` then ``41``)."""
    payload = [{"kind": "thinking_budget", "start_token_ids": [30], "end_token_ids": [31], "budget": 3}]
    harness.add_request("open", [2, 30, 9], sp(payload))
    straddle = [{"kind": "thinking_budget", "start_token_ids": [40, 41], "end_token_ids": [42], "budget": 1}]
    harness.add_request("straddle", [2, 40], sp(straddle))
    request = harness.processor._slots[harness.reqs["open"].slot]
    assert request is not None and request.resident  # followed on the device, not read back
    out = harness.step(["open", "straddle"], torch.zeros(2, VOCAB))
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()  # 1 of 3; no span yet
    harness.commit("open", [5])
    harness.commit("straddle", [41])  # [40 | 41]: the span opens across the prompt's end
    out = harness.step(["open", "straddle"], torch.zeros(2, VOCAB))
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()  # 2 of 3; 0 of 1
    harness.commit("open", [6])
    harness.commit("straddle", [7])
    out = harness.step(["open", "straddle"], torch.zeros(2, VOCAB))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [31]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [42]


def test_add_request_reads_the_prompt_from_vllms_own_staged_write(monkeypatch):
    """With vLLM's real ``RequestState`` (``add_request`` stages the tokens; nothing is written to the
    token matrix before ``apply_staged_writes``), the adapter's ``add_request`` realizes the request
    with its prompt: a reasoning span the prompt opened is seen. (``is_uva_available`` is patched to
    false: this machine has no pinned memory, which the real buffers need.)"""
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils
    from vllm.v1.worker.gpu.states import RequestState

    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)
    state = RequestState(max_num_reqs=4, max_model_len=32, max_num_batched_tokens=64, num_speculative_steps=0,
                         vocab_size=VOCAB, device=torch.device("cpu"))
    proc = DynamoVllmLogitsProcessor(None, LogitsProcRequestState(  # type: ignore[arg-type]
        device=torch.device("cpu"), max_num_reqs=4, vocab_size=VOCAB, all_token_ids=state.all_token_ids,
        prompt_len=state.prompt_len, prefill_len=state.prefill_len, total_len=state.total_len))
    payload = [{"kind": "thinking_budget", "start_token_ids": [30, 31], "end_token_ids": [32], "budget": 4}]
    state.add_request("other", prompt_len=2, all_token_ids=[30, 31, 7], num_computed_tokens=0, max_tokens=4)
    state.add_request("r", prompt_len=4, all_token_ids=[2, 30, 31, 9, 8], num_computed_tokens=0, max_tokens=4)
    slot = state.req_id_to_index["r"]
    assert proc.add_request(slot, sp(payload))
    request = proc._slots[slot]
    assert request is not None and request.processor is not None
    (thinking,) = request.processor.processors
    assert thinking.template.initial == -1  # the span opened one prompt token before generation


def test_the_staged_prompt_is_the_last_write_to_the_slot():
    from dynlogits.adapters.vllm.harness import StagedHostBuffer
    from dynlogits.adapters.vllm.v2 import staged_prompt

    buffer = StagedHostBuffer((4, 16))
    buffer.stage_write(1, 0, [5, 6, 7])
    buffer.stage_write(2, 0, [8, 9])
    buffer.stage_write(1, 0, [3, 4, 5, 6])  # the slot's newer occupant
    assert staged_prompt(buffer, 1, 2) == [3, 4]
    assert staged_prompt(buffer, 2, 2) == [8, 9]
    assert staged_prompt(buffer, 3, 1) is None  # nothing staged for it
    assert staged_prompt(object(), 1, 2) is None  # a runner that stages no writes


# -- containment: faults in the adapter's own steps ---------------------------------------------
def test_a_failure_reading_histories_fails_only_the_requests_that_needed_them(harness, monkeypatch):
    """The prologue that reads hosted requests' histories back from the device is guarded: if it
    raises, those requests are fail-stopped and reported; resident requests and the engine go on."""
    import dynlogits.adapters.vllm.v2 as v2

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("device read failed")

    monkeypatch.setattr(v2, "row_histories", broken)
    harness.add_request("hosted", [2], sp(RECORD))
    harness.add_request("resident", [2], sp(forced(10, 11)))
    out = harness.step(["hosted", "resident"], torch.randn(2, VOCAB))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [EOS]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [10]  # forced
    assert len(harness.processor.failures) == 1 and "device read failed" in harness.processor.failures[0]


def test_a_bug_in_the_resident_path_fails_its_requests_not_the_engine(harness, monkeypatch):
    from dynlogits.sdk.resident.slot_batch import SlotBatch

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("resident path bug")

    harness.add_request("a", [2], sp(forced(10, 11)))
    harness.add_request("b", [2], sp(forced(20, 21)))
    monkeypatch.setattr(SlotBatch, "apply", broken)
    harness.step(["a", "b"], torch.randn(2, VOCAB))  # nothing escapes apply()
    monkeypatch.undo()
    out = harness.step(["a", "b"], torch.randn(2, VOCAB))
    assert [torch.isfinite(r).nonzero().flatten().tolist() for r in out] == [[EOS], [EOS]]
    assert len(harness.processor.failures) == 2 and all("resident path bug" in f for f in harness.processor.failures)


# -- banned_phrases: matched on the device -----------------------------------------------------------
def _masked(row: torch.Tensor) -> list[int]:
    return torch.isneginf(row).nonzero().flatten().tolist()


def _phrases(*phrases: list[int]) -> list[dict[str, Any]]:
    return [{"kind": "banned_phrases", "phrases": [list(p) for p in phrases]}]


def _some_leave(harness: V2SamplerHarness, live: dict[str, Any], rng: Any, chance: float) -> None:
    """Each live request leaves with ``chance``: its slot is reused by a later one."""
    for name in [n for n in live if rng.random() < chance]:
        harness.remove_request(name)
        del live[name]


def _drafting_harness(drafts: int) -> V2SamplerHarness:
    """Five slots, under speculative decoding with ``drafts`` tokens a request (0: none)."""
    from types import SimpleNamespace

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None,
                             use_v2_model_runner=True, model_config=None)
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=5, vllm_config=config)


@pytest.mark.parametrize("drafts", [0, 2])
def test_banned_phrases_are_resident_and_mask_what_the_host_processor_masks(drafts: int) -> None:
    """Random phrase sets (1-4 tokens over five ids, so outputs meet them), prompts, outputs and
    drafts; slots reused by requests of other geometries. Every row masks exactly the ids the host
    processor finds for the history that row sees (committed tokens plus the drafts before it)."""
    import random

    from dynlogits.processors.banned_phrases import BannedPhrasesProcessor

    rng = random.Random(drafts)
    ids = list(range(2, 7))
    harness = _drafting_harness(drafts)
    phrases: dict[str, list[list[int]] | None] = {}
    checked = 0
    for round_ in range(12):
        _some_leave(harness, phrases, rng, 0.4)
        while len(phrases) < 4:
            name = f"r{round_}-{len(phrases)}"
            entry = [[rng.choice(ids) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 6))]
            plain = rng.random() < 0.2
            harness.add_request(name, [rng.choice(ids) for _ in range(rng.randint(1, 5))], sp(None if plain else _phrases(*entry)),
                                output_ids=[rng.choice(ids) for _ in range(rng.randint(0, 5))])
            phrases[name] = None if plain else entry
            assert plain or harness.processor._is_resident[harness.reqs[name].slot]  # no read back of histories
        batch = list(phrases)
        for _ in range(3):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            out = harness.step(batch, torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB), drafts=fed)
            row = 0
            for name in batch:
                for k in range(len(fed.get(name, [])) + 1):
                    seen = harness.output_ids(name) + fed.get(name, [])[:k]
                    entry = phrases[name]
                    want = [] if entry is None else sorted(BannedPhrasesProcessor([tuple(p) for p in entry]).banned(seen))
                    assert _masked(out[row]) == want, (name, entry, seen)
                    checked += bool(want)
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids)])
    assert checked > 50  # rows that mask something were seen


def test_a_phrase_is_matched_in_the_output_only_and_across_the_drafts(harness) -> None:
    harness.add_request("p", [5, 6, 7], sp(_phrases([7, 8, 9], [6, 7, 3])))  # the prompt ends with 6, 7
    out = harness.step(["p"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == []  # a phrase never begins in the prompt (as vLLM's bad_words)
    harness.commit("p", [7])
    out = harness.step(["p"], torch.zeros(2, VOCAB), drafts={"p": [8]})
    assert _masked(out[0]) == [] and _masked(out[1]) == [9]  # the row after draft 8 sees [7, 8]
    harness.commit("p", [8])
    out = harness.step(["p"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == [9]


def test_phrases_that_would_grow_the_device_tables_past_their_bound_are_hosted(harness, monkeypatch) -> None:
    from dynlogits.processors.banned_phrases import BannedPhrasesGroup

    monkeypatch.setattr(BannedPhrasesGroup, "MAX_WINDOW_CELLS", 5)  # entries x width
    harness.add_request("small", [2], sp(_phrases([9], [5, 6])))  # 2 entries x 1 column
    harness.add_request("large", [2], sp(_phrases([5, 6, 7], [8, 9], [4])))  # 3 entries x 2 columns: over
    assert harness.processor._is_resident[harness.reqs["small"].slot]
    assert not harness.processor._is_resident[harness.reqs["large"].slot]  # its histories are read back
    for token in (5, 6):
        harness.commit("small", [token])
        harness.commit("large", [token])
    out = harness.step(["small", "large"], torch.zeros(2, VOCAB))
    assert _masked(out[0]) == [9] and _masked(out[1]) == [4, 7]


def test_the_phrase_tables_are_sized_by_the_requests_in_the_slots_not_by_one_that_left(harness, monkeypatch) -> None:
    """A request whose phrases would not fit beside a wide one is hosted while it holds a slot, and
    resident once the wide one's slot holds another request (the tables rebuilt at what the current
    requests need)."""
    from dynlogits.processors.banned_phrases import BannedPhrasesGroup

    monkeypatch.setattr(BannedPhrasesGroup, "MAX_WINDOW_CELLS", 5)  # entries x width
    harness.add_request("wide", [2], sp(_phrases([5, 6, 7])))  # 1 entry x 2 columns
    many = sp(_phrases([3, 4], [5, 9], [8, 2]))  # 3 entries x 1 column: 3 x 2 beside "wide", over
    harness.add_request("many", [2], many)
    assert not harness.processor._is_resident[harness.reqs["many"].slot]
    harness.remove_request("wide")
    harness.add_request("next", [2], sp(_phrases([9, 4])), output_ids=[9])  # takes the wide one's slot
    harness.remove_request("many")
    harness.add_request("many again", [2], many, output_ids=[5])
    assert harness.processor._is_resident[harness.reqs["many again"].slot]
    out = harness.step(["next", "many again"], torch.zeros(2, VOCAB))
    assert _masked(out[0]) == [4] and _masked(out[1]) == [9]


@pytest.mark.parametrize(("seconds", "stops"), [(60.0, True), (3600.0, False)])
def test_a_deadline_is_resident_and_stops_every_row_of_its_request_once_due(harness, seconds: float, stops: bool) -> None:
    """It reads the clock, not the tokens: no history is read back, with drafts or without. The
    request arrived two minutes ago (the deployment's stamp)."""
    import time

    from dynlogits.sdk.activation import put_arrival

    params = sp([{"kind": "deadline", "seconds": seconds}])
    put_arrival(params.extra_args, time.time() - 120.0)
    harness.add_request("d", [2], params, output_ids=[5])
    harness.add_request("other", [2], sp(_phrases([9])))
    assert harness.processor._is_resident[harness.reqs["d"].slot]
    for drafts in ({}, {"d": [6, 7], "other": [3]}):
        rows = 2 + sum(map(len, drafts.values()))
        out = harness.step(["d", "other"], torch.zeros(rows, VOCAB), drafts=drafts)
        d_rows = 1 + len(drafts.get("d", []))
        for row in range(d_rows):
            assert torch.isfinite(out[row]).nonzero().flatten().tolist() == ([EOS] if stops else list(range(VOCAB)))
        assert all(_masked(out[row]) == [9] for row in range(d_rows, rows))


# -- trigger: followed on the device ---------------------------------------------------------------
@pytest.mark.parametrize("drafts", [0, 2])
def test_a_trigger_is_resident_and_forces_what_the_host_processor_forces(drafts: int) -> None:
    """Random triggers, phrases, prompts (which may hold the trigger: not counted), outputs a
    request resumes with (some past ``MAX_DEVICE_CATCH_UP``: scanned once on the host) and drafts;
    slots reused; some requests hold a ``thinking_budget`` at the same entry position as another's
    trigger, or both. Every row is what the oracle makes of the history it sees."""
    import random
    import time

    from dynlogits.testing.oracle import OracleRequest, expected_row

    rng = random.Random(10 + drafts)
    ids = [2, 3, 4]
    harness = _drafting_harness(drafts)
    live: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}
    fired = 0
    for round_ in range(10):
        _some_leave(harness, live, rng, 0.4)
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            trigger = {"kind": "trigger", "trigger_token_ids": [rng.choice(ids) for _ in range(rng.randint(1, 2))],
                       "phrase_token_ids": [rng.choice(range(10, 15)) for _ in range(rng.randint(1, 3))]}
            thinking = {"kind": "thinking_budget", "start_token_ids": [5], "end_token_ids": [6], "budget": 2}
            payload = rng.choice([[trigger], [trigger], [thinking], [trigger, {**thinking, "budget": 99}],
                                  [{**thinking, "budget": 99}, trigger]])
            prompt = [rng.choice(ids) for _ in range(rng.randint(1, 4))]
            output = [rng.choice(ids + [5]) for _ in range(rng.choice([0, 1, 3, 20]))]
            harness.add_request(name, prompt, sp(payload), output_ids=output)
            live[name] = (payload, prompt)
            assert harness.processor._is_resident[harness.reqs[name].slot]  # no read back of histories
        batch = list(live)
        for _ in range(4):
            fed = {n: [rng.choice(ids + [5]) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            logits = torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB)
            out = harness.step(batch, logits.clone(), drafts=fed)
            row = 0
            for name in batch:
                payload, prompt = live[name]
                request = OracleRequest(prompt=tuple(prompt), stop_token_ids=(EOS,), arrival=time.time(), now=time.time())
                for k in range(len(fed.get(name, [])) + 1):
                    seen = harness.output_ids(name) + fed.get(name, [])[:k]
                    want = expected_row(payload, seen, logits[row].tolist(), request)
                    assert out[row].tolist() == pytest.approx(want), (name, payload, prompt, seen)
                    fired += sum(v == 0.0 for v in want) == 1 and want.count(float("-inf")) == VOCAB - 1
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids + [5])])
    assert not harness.processor.failures
    assert fired > 10  # forced rows were seen


# -- multiple_choice: decided on the device --------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True, None], ids=["eager", "fused", "fallback"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_multiple_choice_is_resident_and_keeps_what_the_host_processor_keeps(drafts: int, fused: bool | None,
                                                                             monkeypatch) -> None:  # noqa: ANN001
    """Random choice sets (EOS inside a choice too), prompts, outputs a request resumes with and
    drafts that mostly follow a choice; slots reused by requests of other geometries. Every row
    keeps exactly the ids the host processor allows after the history it sees; a row that left every
    choice keeps only the stop token: after its committed tokens its request fails (and leaves the
    batch), after drafts only the row stops (the drafts may be rejected). ``fused``: the step through
    ``dynlogits::multiple_choice_keep_`` (its CPU implementation; its gate opened on the CPU), with
    drafts too (the op given ``input_ids``: counted); ``fallback``: the gate open but each fused call
    answered by its eager fallback (what ``GATE.run`` does when a variant fails to compile on CUDA)."""
    import random

    from fused_gates import count_choice_steps

    from dynlogits.kernels.multiple_choice import GATE

    drafted: list[bool] = count_choice_steps(monkeypatch) if fused else []  # per fused step: drafts read
    if fused is None:
        monkeypatch.setattr(GATE, "ready", lambda device: True)
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: eager())

    from dynlogits.processors.multiple_choice import MultipleChoiceProcessor

    rng = random.Random(20 + drafts)
    ids = [EOS, 2, 3, 4]
    harness = _drafting_harness(drafts)
    live: dict[str, MultipleChoiceProcessor] = {}
    checked = failed = 0

    def follow(name: str, history: list[int]) -> int:
        allowed = live[name].allowed(history)
        return rng.choice(allowed) if allowed and rng.random() < 0.85 else rng.choice(ids)

    for round_ in range(24):
        _some_leave(harness, live, rng, 0.3)
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            choices = [[rng.choice(ids[1:] if k == 0 else ids) for k in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 4))]
            live[name] = MultipleChoiceProcessor(choices, EOS)
            output: list[int] = []
            for _ in range(rng.choice([0, 0, 1, 2])):
                output.append(follow(name, output))
            harness.add_request(name, [rng.choice(ids[1:]) for _ in range(rng.randint(1, 4))],
                                sp([{"kind": "multiple_choice", "choices": choices, "eos_token_id": EOS}]), output_ids=output)
            assert harness.processor._is_resident[harness.reqs[name].slot]  # no read back of histories
        batch = list(live)
        fed: dict[str, list[int]] = {}
        for name in batch if drafts else ():
            fed[name] = []
            for _ in range(rng.randint(0, drafts)):
                fed[name].append(follow(name, harness.output_ids(name) + fed[name]))
        out = harness.step(batch, torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB), drafts=fed)
        row = 0
        for name in batch:
            dead = False
            for k in range(len(fed.get(name, [])) + 1):
                seen = harness.output_ids(name) + fed.get(name, [])[:k]
                want = list(live[name].allowed(seen))
                got = torch.isfinite(out[row]).nonzero().flatten().tolist()
                assert got == (want or [EOS]), (name, seen)
                dead |= not want and k == 0
                checked += 1
                row += 1
            if dead:  # fail-stopped: it leaves (the engine ends it at the stop token)
                harness.remove_request(name)
                del live[name]
                failed += 1
            else:
                harness.commit(name, [follow(name, harness.output_ids(name))])
    assert checked > 80 and failed > 3
    assert sum("no token left to sample" in f for f in harness.processor.failures) == failed
    if fused:  # every step through the op; with drafts most of them read drafts
        assert len(drafted) == 24 and (sum(drafted) > 10 if drafts else not any(drafted)), drafted


def test_choices_that_would_grow_the_device_tables_past_their_bound_are_hosted(harness, monkeypatch) -> None:
    from dynlogits.processors.multiple_choice import MultipleChoiceGroup

    def choices(*options: list[int]) -> Any:
        return sp([{"kind": "multiple_choice", "choices": [list(o) for o in options], "eos_token_id": EOS}])

    monkeypatch.setattr(MultipleChoiceGroup, "MAX_WINDOW_CELLS", 8)  # entries x width
    # edges () 5, () 6, (5) EOS, (6) EOS, and (5 EOS) EOS, (6 EOS) EOS: 6 entries x 2 columns: over
    harness.add_request("small", [2], choices([5], [6]))
    assert not harness.processor._is_resident[harness.reqs["small"].slot]
    monkeypatch.setattr(MultipleChoiceGroup, "MAX_WINDOW_CELLS", 12)
    harness.add_request("fits", [2], choices([5], [6]))
    harness.add_request("large", [2], choices([5, 6]))  # () 5, (5) 6, (5 6) EOS, (5 6 EOS) EOS: 4 x 3 with the group's 6 x 2: over
    assert harness.processor._is_resident[harness.reqs["fits"].slot]
    assert not harness.processor._is_resident[harness.reqs["large"].slot]  # its histories are read back
    out = harness.step(["small", "fits", "large"], torch.zeros(3, VOCAB))
    assert [torch.isfinite(out[r]).nonzero().flatten().tolist() for r in range(3)] == [[5, 6], [5, 6], [5]]


def test_the_choice_tables_are_sized_by_the_requests_in_the_slots_not_by_one_that_left(harness, monkeypatch) -> None:
    """As for phrases: a choice set that would not fit beside a longer one is resident once the
    longer one's slot holds another request."""
    from dynlogits.processors.multiple_choice import MultipleChoiceGroup

    def choices(*options: list[int]) -> Any:
        return sp([{"kind": "multiple_choice", "choices": [list(o) for o in options], "eos_token_id": EOS}])

    monkeypatch.setattr(MultipleChoiceGroup, "MAX_WINDOW_CELLS", 12)  # entries x width
    harness.add_request("long", [2], choices([5, 6]))  # 4 entries x 3 columns
    harness.add_request("wide", [2], choices([5], [6]))  # 6 entries x 2 columns: 6 x 3 beside "long", over
    assert not harness.processor._is_resident[harness.reqs["wide"].slot]
    harness.remove_request("long")
    harness.add_request("short", [2], choices([9]))  # 3 entries x 2 columns, in the long one's slot
    harness.remove_request("wide")
    harness.add_request("wide again", [2], choices([5], [6]))
    assert harness.processor._is_resident[harness.reqs["wide again"].slot]
    out = harness.step(["short", "wide again"], torch.zeros(2, VOCAB))
    assert [torch.isfinite(out[r]).nonzero().flatten().tolist() for r in range(2)] == [[9], [5, 6]]


def test_a_classification_over_many_one_token_labels_is_resident_and_keeps_the_labels_then_eos(harness) -> None:
    """60 one-token labels: one entry per label at the root, one for EOS after each and one for each
    label followed by EOS (180 entries of 2 columns), within the device tables' bound: no read back.
    The first row keeps every label (with its logit), the next only EOS, and EOS again after it."""
    labels = list(range(2, 62))
    harness.add_request("classify", [3, 4], sp([{"kind": "multiple_choice", "choices": [[t] for t in labels],
                                                 "eos_token_id": EOS}]))
    assert harness.processor._is_resident[harness.reqs["classify"].slot]
    for want, then in ((labels, 17), ([EOS], EOS), ([EOS], EOS)):
        logits = torch.randn(1, VOCAB)
        out = harness.step(["classify"], logits.clone())
        assert torch.isfinite(out[0]).nonzero().flatten().tolist() == want
        assert torch.equal(out[0, want], logits[0, want])  # the kept ids keep their logits
        harness.commit("classify", [then])
    assert not harness.processor.failures


@pytest.mark.parametrize("payload", [
    [{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": EOS}],
    [{"kind": "trigger", "trigger_token_ids": [3], "phrase_token_ids": [9]}],
    [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}],
    _phrases([8], [3, 9]),
    [{"kind": "allowed_tokens", "token_ids": [5, 6], "eos_token_id": EOS}, {"kind": "min_tokens", "min_tokens": 2,
                                                                             "stop_token_ids": [EOS]}],
    [{"kind": "thinking_budget", "start_token_ids": [4], "end_token_ids": [9], "budget": 1}],  # opened in the prompt
], ids=["multiple_choice", "trigger", "forced_sequence", "banned_phrases", "allowed_and_min_tokens", "thinking_budget"])
def test_a_prefill_chunks_row_never_fails_its_request(harness, payload) -> None:
    """Under chunked prefill every request of a step has a logits row, a prompt chunk's at its last
    token (its sample discarded): it has generated nothing yet, so it must not look like an output
    that left the rules; the first real row then behaves as without chunks."""
    harness.add_request("c", [2, 3, 4, 3, 2], sp(payload))
    for end in (2, 4):  # chunks end at prompt tokens 2 and 4 of 5
        row = harness.step(["c"], torch.zeros(1, VOCAB), chunks={"c": end})[0]
        assert torch.isfinite(row).nonzero().flatten().tolist() != [EOS]  # not fail-stopped
    out = harness.step(["c"], torch.zeros(1, VOCAB))  # prefill done: the row of generated position 0
    assert not harness.processor.failures
    fresh = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4)
    fresh.add_request("c", [2, 3, 4, 3, 2], sp(payload))
    assert torch.equal(out, fresh.step(["c"], torch.zeros(1, VOCAB)))


# -- scoped entries: phases followed on the device -------------------------------------------------
@pytest.mark.parametrize("drafts", [0, 2])
def test_scoped_entries_are_resident_and_act_where_the_host_processor_acts(drafts: int) -> None:
    """Random reasoning delimiters (one or two tokens), prompts (which may leave a span open or end
    inside a delimiter), outputs a request resumes with (some past ``MAX_DEVICE_CATCH_UP``: scanned
    once on the host) and drafts; ``banned_tokens``, ``logit_bias``, ``allowed_tokens`` and the
    positional ``min_tokens`` and ``forced_sequence`` (counted from their phase's stretch) scoped to
    either phase, two at one entry position across requests, some beside a ``thinking_budget``;
    slots reused. Every such request is resident (no history read back) and every row is what the
    oracle makes of the history it sees."""
    import random
    import time

    from dynlogits.testing.oracle import OracleRequest, expected_row

    rng = random.Random(20 + drafts)
    ids = [2, 3, 4, 5, 6, 7, 8]
    harness = _drafting_harness(drafts)
    live: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}
    phases = {"reasoning": 0, "answer": 0}
    for round_ in range(10):
        _some_leave(harness, live, rng, 0.4)
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                         "end_token_ids": [7, 8][: rng.randint(1, 2)]}
            scoped = []
            for _ in range(rng.randint(1, 2)):
                scope = rng.choice(["reasoning", "answer"])
                scoped.append(rng.choice([
                    {"kind": "banned_tokens", "token_ids": rng.sample(range(10, 20), 3), "scope": scope},
                    {"kind": "logit_bias", "bias": {str(i): rng.choice([-2.5, 1.5]) for i in rng.sample(range(10, 20), 2)},
                     "scope": scope},
                    {"kind": "allowed_tokens", "token_ids": [5, 6, 7, 8, *rng.sample(range(10, 30), 5)], "eos_token_id": EOS,
                     "scope": scope},
                    {"kind": "min_tokens", "min_tokens": rng.randint(1, 6), "stop_token_ids": [EOS, 9], "scope": scope},
                ]))
            if rng.random() < 0.3:  # positional, counted from its stretch; alone (a mask beside it could empty a row)
                scoped = [{"kind": "forced_sequence", "token_ids": rng.sample(range(10, 20), rng.randint(1, 4)),
                           "eos_token_id": EOS, "scope": rng.choice(["reasoning", "answer"])}]
            thinking = {"kind": "thinking_budget", "budget": 99}
            payload = rng.choice([[reasoning, *scoped], [reasoning, thinking, *scoped], [reasoning, *scoped, thinking]])
            prompt = [rng.choice(ids) for _ in range(rng.randint(1, 4))]
            output = [rng.choice(ids) for _ in range(rng.choice([0, 1, 3, 20]))]
            harness.add_request(name, prompt, sp(payload), output_ids=output)
            live[name] = (payload, prompt)
            assert harness.processor._is_resident[harness.reqs[name].slot]  # no read back of histories
            assert not harness.processor._is_hosted[harness.reqs[name].slot]
        batch = list(live)
        for _ in range(4):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            logits = torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB)
            out = harness.step(batch, logits.clone(), drafts=fed)
            row = 0
            for name in batch:
                payload, prompt = live[name]
                request = OracleRequest(prompt=tuple(prompt), stop_token_ids=(EOS,), arrival=time.time(), now=time.time())
                for k in range(len(fed.get(name, [])) + 1):
                    seen = harness.output_ids(name) + fed.get(name, [])[:k]
                    want = expected_row(payload, seen, logits[row].tolist(), request)
                    assert out[row].tolist() == pytest.approx(want), (name, payload, prompt, seen)
                    phases["answer" if out[row].tolist() == pytest.approx(logits[row].tolist()) else "reasoning"] += 1
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids)])
    assert not harness.processor.failures
    assert min(phases.values()) > 10  # rows the entries left alone and rows they changed were both seen


@pytest.mark.parametrize("drafts", [0, 2])
def test_a_scoped_allowed_set_the_grammar_empties_fails_its_request_in_its_phase_only(drafts: int) -> None:
    """allowed {10, 11} + EOS scoped to the answer, resident; the grammar masks all three: while the
    output is in reasoning nothing fails; once the answer begins the row has no token left, so it is
    fail-stopped to its stop token on the device and the request fails (reported once)."""
    harness = _drafting_harness(drafts)
    payload = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
               {"kind": "allowed_tokens", "token_ids": [10, 11], "eos_token_id": EOS, "scope": "answer"}]
    harness.add_request("a", [2, 5], sp(payload))  # the prompt opens a span: generation starts in reasoning
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    masked = torch.randn(1, VOCAB)
    masked[0, [10, 11, EOS]] = float("-inf")
    assert torch.equal(harness.step(["a"], masked.clone()), masked)  # reasoning: the entry is idle
    harness.commit("a", [7])  # the span closes: the next row is in the answer
    out = harness.step(["a"], masked.clone())
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [EOS]  # fail-stopped on the device
    harness.commit("a", [EOS])
    harness.step(["a"], torch.zeros(1, VOCAB))  # the flags' copy has landed: reported at the next call
    assert len(harness.processor.failures) == 1 and "no token left" in harness.processor.failures[0]


@pytest.mark.parametrize("drafts", [0, 2])
def test_a_scoped_forced_sequence_counts_from_its_stretch_whatever_the_prompt_or_a_resume_left(drafts: int) -> None:
    """``forced_sequence`` [10, 11, 12] scoped to a phase, resident: a prompt that opened the span
    counts reasoning from the first generated token (not from the span's start in the prompt); a
    request resumed with more than ``MAX_DEVICE_CATCH_UP`` tokens whose span closed one token before
    the end (its state from the one host scan) counts the answer from that close; a fresh one forces
    from its stretch's start each time it enters its phase."""
    from dynlogits.processors.device_thinking import DeviceThinking

    harness = _drafting_harness(drafts)
    delimiters = {"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]}

    def forced(scope: str) -> Any:
        return sp([delimiters, {"kind": "forced_sequence", "token_ids": [10, 11, 12], "eos_token_id": EOS,
                                "scope": scope}])

    resumed = [3] * 8 + [5] + [4] * 6 + [7] + [3]
    assert len(resumed) > DeviceThinking.MAX_DEVICE_CATCH_UP
    harness.add_request("prompt-opened", [2, 3, 5, 4], forced("reasoning"))
    harness.add_request("resumed", [2], forced("answer"), output_ids=resumed)
    harness.add_request("fresh", [2], forced("answer"))
    commits = {"prompt-opened": [4, 4, 4], "resumed": [3, 3, 3], "fresh": [5, 7, 3]}
    got: dict[str, list[int]] = {name: [] for name in commits}
    for step in range(3):
        names = list(commits)
        out = harness.step(names, torch.zeros(len(names), VOCAB))
        for row, name in enumerate(names):
            finite = torch.isfinite(out[row]).nonzero().flatten().tolist()
            got[name].append(finite[0] if len(finite) == 1 else -1)  # -1: left alone
            harness.commit(name, [commits[name][step]])
    assert got == {"prompt-opened": [10, 11, 12],  # reasoning from the first generated token
                   "resumed": [11, 12, EOS],  # one answer token before the resume: the second forced id
                   "fresh": [10, -1, 10]}  # answer; the span opens (idle); it closes: the answer starts over
    assert not harness.processor.failures
