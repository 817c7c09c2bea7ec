"""DYN_ENABLE_TEST_LOGITS_PROCESSOR: on only for "1", only on generating roles, tokenizer touched only then."""

import copy

import pytest

from dynlogits.policy.hook import TEST_HOOK_ENV, TEST_HOOK_TEXT, test_hook_spec
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import SpecError


def _untouchable():
    raise AssertionError("the tokenizer must not be loaded here")


@pytest.mark.parametrize("value", [None, "0", "true", "yes", " 1", "1 ", ""])
def test_hook_is_off_unless_exactly_one(value):
    env = {} if value is None else {TEST_HOOK_ENV: value}
    assert test_hook_spec(_untouchable, disaggregation_mode=DisaggregationMode.AGGREGATED, environ=env) is None


@pytest.mark.parametrize("mode", [DisaggregationMode.PREFILL, DisaggregationMode.ENCODE])
def test_hook_never_loads_a_tokenizer_on_non_generating_roles(mode):
    assert test_hook_spec(_untouchable, disaggregation_mode=mode, environ={TEST_HOOK_ENV: "1"}) is None


@pytest.mark.parametrize("mode", [DisaggregationMode.AGGREGATED, DisaggregationMode.DECODE])
def test_hook_forces_hello_world_with_the_workers_tokenizer(mode, embedded_tokenizer):
    spec = test_hook_spec(lambda: embedded_tokenizer, disaggregation_mode=mode, environ={TEST_HOOK_ENV: "1"})
    (entry,) = spec.entries
    assert entry.kind == "forced_sequence" and spec.generation_only
    assert embedded_tokenizer.decode(list(entry.token_ids)) == TEST_HOOK_TEXT
    assert entry.token_ids == tuple(embedded_tokenizer.encode(TEST_HOOK_TEXT, add_special_tokens=False))
    assert entry.eos_token_id == embedded_tokenizer.eos_token_id is not None


def test_tokenizer_without_eos_gives_a_clear_error(embedded_tokenizer):
    no_eos = copy.deepcopy(embedded_tokenizer)
    no_eos.eos_token = None
    assert no_eos.eos_token_id is None
    with pytest.raises(SpecError, match=f"{TEST_HOOK_ENV}: the worker's tokenizer has no EOS token"):
        test_hook_spec(lambda: no_eos, disaggregation_mode=DisaggregationMode.AGGREGATED, environ={TEST_HOOK_ENV: "1"})
