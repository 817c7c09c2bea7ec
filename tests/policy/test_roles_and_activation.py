"""Role gating and writing the payload into sampling params."""

import pytest
from vllm import SamplingParams

from dynlogits.sdk import activate_logits_processors
from dynlogits.policy.roles import DisaggregationMode, is_generation_stage, logits_processors_for_request
from dynlogits.specs import WIRE_KEY, BannedTokensSpec, ForcedTextSpec, ForcedTokenSequenceSpec, LogitsProcessorSpec, SpecError

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


def test_activation_refuses_unresolved_text():
    with pytest.raises(SpecError, match="cannot cross the wire"):
        activate_logits_processors({}, [ForcedTextSpec(text="hi")])
