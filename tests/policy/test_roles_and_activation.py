"""Role gating and writing the payload into sampling params."""

import pytest
from vllm import SamplingParams

from dynlogits.policy.roles import DisaggregationMode, is_generation_stage, logits_processors_for_request
from dynlogits.sdk import activate_logits_processors, carried_arrival
from dynlogits.specs import ARRIVAL_KEY, WIRE_KEY, BannedTokensSpec, ForcedTextSpec, ForcedTokenSequenceSpec, LogitsProcessorSpec, SpecError

FORCED = ForcedTokenSequenceSpec(token_ids=(3, 4), eos_token_id=1)
SPEC = LogitsProcessorSpec(entries=(FORCED,))


@pytest.mark.parametrize(("mode", "generates"), [("agg", True), ("decode", True), ("prefill", False), ("encode", False)])
def test_only_aggregated_and_decode_workers_generate(mode, generates):
    assert is_generation_stage(DisaggregationMode(mode)) is generates
    assert logits_processors_for_request(SPEC, disaggregation_mode=DisaggregationMode(mode)) == ([FORCED] if generates else [])


def test_spec_without_generation_only_applies_on_every_role():
    spec = LogitsProcessorSpec(entries=(FORCED,), generation_only=False)
    assert logits_processors_for_request(spec, disaggregation_mode=DisaggregationMode.PREFILL) == [FORCED]


def test_no_spec_means_no_entries():
    assert logits_processors_for_request(None, disaggregation_mode=DisaggregationMode.AGGREGATED) == []


def test_activation_writes_the_reference_payload_into_real_sampling_params():
    params = SamplingParams(max_tokens=4)
    activate_logits_processors(params, [FORCED, BannedTokensSpec(token_ids=(9,))])
    assert params.extra_args[WIRE_KEY] == [
        {"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": 1},
        {"kind": "banned_tokens", "token_ids": [9]},
    ]


def test_activation_without_entries_removes_a_smuggled_payload():
    params = SamplingParams(max_tokens=4, extra_args={WIRE_KEY: [{"kind": "python", "factory": "os:system"}], "other": 1})
    activate_logits_processors(params, [])
    assert params.extra_args == {"other": 1}


def test_activation_replaces_a_smuggled_payload_with_the_gated_one():
    extra = {WIRE_KEY: [{"kind": "banned_tokens", "token_ids": [1]}]}
    activate_logits_processors(extra, [FORCED])
    assert extra[WIRE_KEY] == [{"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": 1}]  # the wire form: no scope when it is "always"


def test_activation_stamps_the_arrival_beside_the_payload_and_drops_a_smuggled_one():
    extra = {ARRIVAL_KEY: 1e12, "other": 1}  # a client's: its deadline would never come
    activate_logits_processors(extra, [FORCED], arrival_time=1700000000.25)
    assert extra[ARRIVAL_KEY] == 1700000000.25 and carried_arrival(extra) == 1700000000.25
    activate_logits_processors(extra, [FORCED])  # no arrival given: none is carried
    assert ARRIVAL_KEY not in extra and carried_arrival(extra) is None
    extra[ARRIVAL_KEY] = 5.0
    activate_logits_processors(extra, [], arrival_time=6.0)  # nothing to realize: no arrival either
    assert extra == {"other": 1}


@pytest.mark.parametrize("value", ["5", True, float("nan"), float("inf"), None, [5]])
def test_an_arrival_that_is_not_a_finite_number_is_not_read(value):
    assert carried_arrival({ARRIVAL_KEY: value}) is None


def test_activation_refuses_unresolved_text():
    with pytest.raises(SpecError, match="cannot cross the wire"):
        activate_logits_processors({}, [ForcedTextSpec(text="hi")])


def test_the_vllm_worker_puts_its_arrival_beside_the_payload_and_never_the_clients(embedded_tokenizer):
    from dynlogits.serve.protocol import SamplingOptions
    from dynlogits.serve.worker.vllm_engine import VllmEngine

    engine = VllmEngine(engine=None, tokenizer=embedded_tokenizer, model_name="m", max_model_len=512, vocab_size=1024,
                        adapter_registered=True)
    client_xargs = {WIRE_KEY: [{"kind": "smuggled"}], ARRIVAL_KEY: 1e12, "theirs": 1}
    params = engine.sampling_params(SamplingOptions(), [FORCED], client_xargs, arrival_time=1700000000.25)
    assert params.extra_args == {WIRE_KEY: [{"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": 1}],
                                 ARRIVAL_KEY: 1700000000.25, "theirs": 1}
    params = engine.sampling_params(SamplingOptions(), [], client_xargs, arrival_time=1700000000.25)
    assert params.extra_args == {"theirs": 1}
