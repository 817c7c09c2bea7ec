"""The request fields of vLLM's open DRY pull request (#50584: ``dry_multiplier``, ``dry_base``,
``dry_allowed_length``, ``dry_sequence_breakers``, ``dry_penalty_last_n``) on an OpenAI body are one
``dry`` entry (``dynlogits.serve.control_fields``): only where the operator allows the kind, ``0`` or
no ``dry_multiplier`` asking for nothing, and every error named by the request field."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.config import parse_config
from dynlogits.serve.frontend import validation
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest
from dynlogits.serve.http.errors import HTTPError
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, parse_entries

ALLOWED = parse_config({"allow_request_kinds": ["dry", "banned_tokens"]})
MESSAGES = [{"role": "user", "content": "hi"}]


def _entries(fields: dict[str, Any], config: Any = ALLOWED) -> list[Any]:
    """The validated entries a request with these fields runs (errors renamed as the frontend and the worker do)."""
    controls = with_controls([{"kind": "banned_tokens", "token_ids": [1]}], fields, config)
    try:
        return list(parse_entries(controls.entries, allowed_kinds=sorted(config.allow_request_kinds), limits=config.limits))
    except SpecError as err:
        raise rename_control_paths(err, controls.origins) from None


def test_the_dry_fields_become_one_dry_entry_after_the_clients_own() -> None:
    fields = {"dry_multiplier": 0.8, "dry_base": 1.5, "dry_allowed_length": 3, "dry_sequence_breakers": ["\n", "###"],
              "dry_penalty_last_n": 256}
    controls = with_controls(None, fields, ALLOWED)
    assert controls.origins == ["dry_multiplier"]
    assert controls.entries == [{"kind": "dry", "multiplier": 0.8, "base": 1.5, "allowed_length": 3,
                                 "sequence_breakers": ["\n", "###"], "penalty_last_n": 256}]
    banned, dry = _entries(fields)
    assert banned.kind == "banned_tokens" and dry.kind == "dry"
    assert (dry.multiplier, dry.base, dry.allowed_length, dry.sequence_breakers, dry.penalty_last_n) == (
        0.8, 1.5, 3, ("\n", "###"), 256)


def test_the_fields_left_out_take_llama_cpps_defaults_and_empty_breakers_mean_none() -> None:
    (_, dry) = _entries({"dry_multiplier": 1})
    assert (dry.base, dry.allowed_length, dry.sequence_breakers, dry.penalty_last_n) == (1.75, 2, ("\n", ":", '"', "*"), -1)
    (_, dry) = _entries({"dry_multiplier": 1, "dry_sequence_breakers": []})
    assert dry.sequence_breakers == ()


@pytest.mark.parametrize("fields", [{"dry_multiplier": 0}, {"dry_multiplier": 0.0, "dry_base": 2.0},
                                    {"dry_base": 2.0, "dry_allowed_length": 4}, {"dry_multiplier": None}])
def test_no_multiplier_or_zero_asks_for_nothing_even_where_the_kind_is_not_allowed(fields: dict[str, Any]) -> None:
    controls = with_controls(None, fields, parse_config({"allow_request_kinds": ["banned_tokens"]}))
    assert controls.entries == [] and controls.origins == []


def test_a_deployment_that_does_not_allow_dry_refuses_the_field_by_name() -> None:
    with pytest.raises(SpecError) as err:
        with_controls(None, {"dry_multiplier": 0.8}, parse_config({"allow_request_kinds": ["banned_tokens"]}))
    (problem,) = err.value.problems
    assert problem.path == "dry_multiplier" and "'dry'" in problem.rule and "does not allow" in problem.rule


@pytest.mark.parametrize(("fields", "path", "rule"), [
    ({"dry_multiplier": -1}, "dry_multiplier", "must be >= 0"),
    ({"dry_multiplier": "1"}, "dry_multiplier", "must be a number"),
    ({"dry_multiplier": 1, "dry_base": 0.5}, "dry_base", "must be >= 1"),
    ({"dry_multiplier": 1, "dry_allowed_length": 0}, "dry_allowed_length", "must be >= 1"),
    ({"dry_multiplier": 1, "dry_penalty_last_n": 5000}, "dry_penalty_last_n", "must be <= 2048"),
    ({"dry_multiplier": 1, "dry_penalty_last_n": -2}, "dry_penalty_last_n", "must be >= -1"),
    ({"dry_multiplier": 1, "dry_sequence_breakers": ["x" * 41]}, "dry_sequence_breakers[0]", "must have at most 40"),
    ({"dry_multiplier": 1, "dry_sequence_breakers": [":"] * 17}, "dry_sequence_breakers", "must have at most 16"),
    ({"dry_multiplier": 1, "dry_sequence_breakers": ":"}, "dry_sequence_breakers", ""),
])
def test_a_bad_value_is_refused_naming_the_request_field(fields: dict[str, Any], path: str, rule: str) -> None:
    with pytest.raises(SpecError) as err:
        _entries(fields)
    assert any(p.path == path and p.rule.startswith(rule) for p in err.value.problems), err.value.problems


def test_the_frontend_answers_400_naming_the_field() -> None:
    config = parse_config({"allow_request_kinds": ["dry"]})
    with pytest.raises(HTTPError) as err:
        validation.validate_request(ChatCompletionRequest, {"model": "m", "messages": MESSAGES, "dry_multiplier": 1,
                                                            "dry_penalty_last_n": 99999}, config)
    assert err.value.status == 400 and err.value.param == "dry_penalty_last_n"
    body, kinds = validation.validate_request(ChatCompletionRequest, {"model": "m", "messages": MESSAGES,
                                                                      "dry_multiplier": 1, "dry_base": 1.5}, config)
    assert kinds == ["dry"]
    assert body.generate_request("r").controls()["dry_base"] == 1.5
