"""What a factory's RealizeContext holds beyond the prompt: its request id, its sampling parameters
and the tokenizer's vocabulary (loaded only when read), on the SDK and through the real adapters."""

from __future__ import annotations

import types

import pytest
from transformers import AutoTokenizer

from dynlogits import sdk
from dynlogits.model_builder import default_model_dir
from dynlogits.processors.base import SamplingView, Vocabulary
from dynlogits.testing import plugin_factories, plugin_kinds

VOCAB = 32
FACTS = [{"kind": "kit.facts", "tag": "t"}]


def _contexts(facts: sdk.RequestFacts | None) -> list:
    with plugin_kinds.registered(), plugin_factories.recording() as seen:
        request = sdk.realize(FACTS, vocab_size=VOCAB, stop_token_id=1, facts=facts)
        assert request is not None and not request.failed
        return list(seen["t"])


def test_the_context_carries_the_request_id_and_sampling_parameters():
    sampling = SamplingView(temperature=0.5, top_p=0.9, top_k=40, seed=7, max_tokens=16, n=2)
    (ctx,) = _contexts(sdk.RequestFacts.of(prompt_ids=[3], eos_token_id=1, request_id="req-9", sampling=sampling))
    assert ctx.request_id == "req-9"
    assert ctx.sampling == sampling


def test_a_request_without_an_engine_id_gets_one_of_this_process():
    (a,) = _contexts(None)
    (b,) = _contexts(sdk.RequestFacts.of(prompt_ids=None, eos_token_id=1))
    assert a.request_id.startswith("local-") and b.request_id.startswith("local-") and a.request_id != b.request_id
    assert a.sampling == SamplingView() and a.vocabulary is None


def test_the_vocabulary_is_loaded_only_when_read_and_once():
    loads = []

    def load() -> list[str]:
        loads.append(1)
        return [f"t{i}" for i in range(VOCAB - 2)]  # a padded width: the last ids have no text

    vocabulary = Vocabulary(load)
    facts = sdk.RequestFacts.of(prompt_ids=[3], eos_token_id=1, vocabulary=vocabulary)
    first, second = _contexts(facts)[0], _contexts(facts)[0]
    assert loads == []  # realized twice, never read
    assert first.vocabulary == second.vocabulary == tuple(f"t{i}" for i in range(VOCAB - 2))
    assert loads == [1]


def test_a_failed_load_is_tried_again():
    calls = []

    def load() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("tokenizer files missing")
        return ["a"]

    vocabulary = Vocabulary(load)
    with pytest.raises(OSError):
        vocabulary.strings()
    assert vocabulary.strings() == ("a",)


def test_a_tokenizers_vocabulary_is_each_ids_text_and_shared_per_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    vocabulary = Vocabulary.of_tokenizer(tokenizer)
    assert vocabulary is Vocabulary.of_tokenizer(tokenizer)
    strings = vocabulary.strings()
    assert len(strings) == len(tokenizer)
    some = tokenizer.encode("hello world", add_special_tokens=False)
    assert "".join(strings[i] for i in some) == tokenizer.decode(some)
    assert Vocabulary.of_tokenizer(None) is None


def test_sampling_view_reads_each_engines_names_and_treats_off_as_none():
    from vllm import SamplingParams

    view = SamplingView.read(SamplingParams(temperature=0.8, top_k=-1, seed=3, max_tokens=9, n=2))
    assert view == SamplingView(temperature=0.8, top_p=1.0, top_k=None, min_p=0.0, seed=3, max_tokens=9, n=2)
    sglang_like = types.SimpleNamespace(temperature=0.7, top_k=5, max_new_tokens=12, sampling_seed=4, n=True)
    assert SamplingView.read(sglang_like, max_tokens="max_new_tokens", seed="sampling_seed") == SamplingView(
        temperature=0.7, top_k=5, seed=4, max_tokens=12)  # a bool is no count
    assert SamplingView.read(None) == SamplingView()


def test_vllm_realization_gives_the_sampling_parameters_report_id_and_engine_vocabulary():
    from vllm import SamplingParams

    from dynlogits.adapters.vllm.request import realize_request
    from dynlogits.sdk.failure_reports import REPORT_KEY

    vocabulary = Vocabulary(lambda: ["x"] * VOCAB)
    params = SamplingParams(temperature=0.3, top_p=0.5, seed=11, max_tokens=5,
                            extra_args={"dynamo_logits": FACTS,
                                        REPORT_KEY: "r-1"})
    with plugin_kinds.registered(), plugin_factories.recording() as seen:
        request = realize_request(params, vocab_size=VOCAB, prompt_ids=[3, 4], vocabulary=vocabulary)
        assert request is not None and not request.failed
        (ctx,) = seen["t"]
    assert ctx.request_id == "r-1"
    assert ctx.sampling == SamplingView(temperature=0.3, top_p=0.5, top_k=None, min_p=0.0, seed=11, max_tokens=5, n=1)
    assert ctx.tokenizer_vocabulary is vocabulary


def test_sglang_facts_carry_its_rid_its_normalized_sampling_and_its_tokenizers_vocabulary():
    from sglang.srt.sampling.sampling_params import SamplingParams as SglangParams

    from dynlogits.adapters.sglang.processor import _with_engine_facts

    params = SglangParams(temperature=0.7, top_k=-1, max_new_tokens=12, sampling_seed=5)
    params.normalize(None)
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    req = types.SimpleNamespace(rid="abc", sampling_params=params, tokenizer=tokenizer)
    facts = _with_engine_facts(sdk.RequestFacts.of(prompt_ids=[3], eos_token_id=1), req)
    assert facts.request_id == "abc"
    assert facts.sampling == SamplingView(temperature=0.7, top_p=1.0, top_k=None, min_p=0.0, seed=5, max_tokens=12, n=1)
    assert facts.vocabulary is Vocabulary.of_tokenizer(tokenizer)
    assert _with_engine_facts(facts, types.SimpleNamespace()).vocabulary is None  # no tokenizer set
