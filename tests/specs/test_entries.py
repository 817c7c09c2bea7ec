"""Spec models: every rejection names the field and the rule."""

import math

import pytest
from pydantic import ValidationError

from dynlogits.specs import (
    ForcedTokenSequenceSpec,
    LogitsProcessorSpec,
    SpecError,
    SpecLimits,
    parse_entries,
    parse_spec,
)


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(SpecError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_spec_round_trips_every_entry_kind():
    data = {
        "entries": [
            {"kind": "forced_sequence", "token_ids": [1, 2], "eos_token_id": 3},
            {"kind": "forced_text", "text": "Hello world!"},
            {"kind": "banned_tokens", "token_ids": [4]},
            {"kind": "allowed_tokens", "token_ids": [5], "eos_token_id": 3},
            {"kind": "logit_bias", "bias": {"7": -1.5}},
            {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [3]},
            {"kind": "thinking_budget", "start_token_ids": [8], "end_token_ids": [9], "budget": 0},
            {"kind": "reasoning", "start_text": "<think>", "end_token_ids": [9]},
            {"kind": "banned_phrases", "phrases": [[4, 5], [6]], "texts": ["hello world"], "scope": "answer"},
            {"kind": "multiple_choice", "texts": ["yes", "no"]},
            {"kind": "trigger", "trigger_text": "Answer:", "phrase_token_ids": [5, 6]},
            {"kind": "deadline", "seconds": 2.5},
            {"kind": "prompt_tokens", "mode": "boost", "boost": 1.0, "scope": "reasoning"},
            {"kind": "python", "factory": "pkg.mod:Make", "kwargs": {"a": [1, {"b": None}]}},
        ],
        "generation_only": False,
    }
    spec = parse_spec(data)
    assert [e.kind for e in spec.entries] == [e["kind"] for e in data["entries"]]
    assert spec.model_dump(mode="json")["entries"][4] == {"scope": "always", "kind": "logit_bias", "bias": {"7": -1.5}}
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_specs_are_frozen_and_forbid_extra_fields():
    spec = LogitsProcessorSpec(entries=(ForcedTokenSequenceSpec(token_ids=(1,), eos_token_id=2),))
    with pytest.raises(ValidationError):
        spec.generation_only = False  # type: ignore[misc]
    assert _error(parse_spec, {"entries": [{"kind": "banned_tokens", "token_ids": [1]}], "extra": 1}) == "extra: unknown field"


def test_generation_only_defaults_to_true():
    assert parse_spec({"entries": [{"kind": "banned_tokens", "token_ids": [1]}]}).generation_only is True


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kind": "forced_sequence", "token_ids": [1, 2, 3, -1], "eos_token_id": 0}, "entries[0].token_ids[3]: must be >= 0"),
        ({"kind": "forced_sequence", "token_ids": ["1"], "eos_token_id": 0}, "entries[0].token_ids[0]: must be an integer"),
        ({"kind": "banned_tokens", "token_ids": []}, "entries[0].token_ids: must have at least 1 item"),
        ({"kind": "logit_bias", "bias": {"3": math.nan}}, 'entries[0].bias["3"]: must be a finite number'),
        ({"kind": "logit_bias", "bias": {"3": math.inf}}, 'entries[0].bias["3"]: must be a finite number'),
        ({"kind": "logit_bias", "bias": {"x": 1.0}}, 'entries[0].bias["x"]: must be a decimal token id such as "42"'),
        ({"kind": "forced_text", "text": ""}, "entries[0].text: must have at least 1 character"),
        ({"kind": "python", "factory": "not an import"}, "entries[0].factory: must be an import string 'package.module:Name'"),
        ({"kind": "warp"}, "entries[0]: unknown kind 'warp'"),
        ({"kind": "banned_tokens", "token_ids": [1], "mask": True}, "entries[0].mask: unknown field"),
    ],
)
def test_bad_entry_error_names_path_and_rule(entry, message):
    assert _error(parse_spec, {"entries": [entry]}).startswith(message)


def test_all_problems_are_reported_at_once():
    err = _error(parse_spec, {"entries": [{"kind": "banned_tokens", "token_ids": [-1]}, {"kind": "min_tokens", "min_tokens": 0, "stop_token_ids": [1]}]})
    assert err == "entries[0].token_ids[0]: must be >= 0; entries[1].min_tokens: must be >= 1"


def test_operator_can_tighten_limits():
    tight = SpecLimits(max_entries=1, max_token_ids=2, max_text_chars=3)
    data = {"entries": [{"kind": "banned_tokens", "token_ids": [1, 2, 3]}, {"kind": "forced_text", "text": "abcd"}]}
    assert _error(parse_spec, data, limits=tight) == (
        "entries: must have at most 1 entries (limit max_entries); "
        "entries[0].token_ids: must have at most 2 items (limit max_token_ids); "
        "entries[1].text: must have at most 3 characters (limit max_text_chars)"
    )
    parse_spec(data)  # the defaults accept it


def test_limits_reject_nonsense_values():
    with pytest.raises(ValueError, match="limits.max_entries"):
        SpecLimits(max_entries=0)


def test_request_entries_never_accept_python_kind():
    err = _error(parse_entries, [{"kind": "python", "factory": "os:system"}], allowed_kinds=None)
    assert err == "logits_processors[0].kind: kind 'python' is operator-only and may not be sent in a request"


def test_request_entries_respect_the_allow_list():
    ok = parse_entries([{"kind": "forced_text", "text": "hi"}], allowed_kinds=["forced_text"])
    assert ok[0].kind == "forced_text"
    err = _error(parse_entries, [{"kind": "banned_tokens", "token_ids": [1]}], allowed_kinds=["forced_text"])
    assert err.startswith("logits_processors[0].kind: kind 'banned_tokens' is not allowed by this deployment")
