"""TensorRT-LLM's request field ``no_repeat_ngram_size`` on an OpenAI body is a ``no_repeat_ngram``
entry (``dynlogits.serve.control_fields``): mapped exactly, only where the operator allows the kind,
its errors named by the field, never accepted and ignored."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.config import parse_config
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest
from dynlogits.serve.openai_controls import rename_control_paths, with_controls
from dynlogits.specs import SpecError, parse_entries

ALLOWED = parse_config({"allow_request_kinds": ["no_repeat_ngram", "banned_tokens"]})


def _entries(fields: dict[str, Any], config: Any = ALLOWED) -> list[Any]:
    """The validated entries a request with these fields runs (errors renamed as the frontend and the worker do)."""
    controls = with_controls([{"kind": "banned_tokens", "token_ids": [1]}], fields, config)
    try:
        return list(parse_entries(controls.entries, allowed_kinds=sorted(config.allow_request_kinds), limits=config.limits))
    except SpecError as err:
        raise rename_control_paths(err, controls.origins) from None


def test_the_field_becomes_a_no_repeat_ngram_of_that_size_after_the_clients_entries() -> None:
    controls = with_controls(None, {"no_repeat_ngram_size": 3}, ALLOWED)
    assert controls.entries == [{"kind": "no_repeat_ngram", "size": 3}] and controls.origins == ["no_repeat_ngram_size"]
    entries = _entries({"no_repeat_ngram_size": 3})
    assert [e.kind for e in entries] == ["banned_tokens", "no_repeat_ngram"]
    assert entries[1].size == 3 and entries[1].include_prompt is False


def test_the_frontend_body_carries_it_to_the_worker_as_sent() -> None:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "no_repeat_ngram_size": 2})
    assert body.controls()["no_repeat_ngram_size"] == 2
    assert body.generate_request("r").controls()["no_repeat_ngram_size"] == 2


def test_a_deployment_that_does_not_allow_the_kind_refuses_the_field_by_name() -> None:
    with pytest.raises(SpecError) as err:
        with_controls(None, {"no_repeat_ngram_size": 2}, parse_config({"allow_request_kinds": ["banned_tokens"]}))
    (problem,) = err.value.problems
    assert problem.path == "no_repeat_ngram_size" and "'no_repeat_ngram'" in problem.rule and "does not allow" in problem.rule


@pytest.mark.parametrize(("value", "rule"), [(0, "must be >= 1"), (33, "must be <= 32"), ("2", "must be an integer"),
                                             (2.5, "must be an integer"), (True, "must be an integer")])
def test_a_bad_size_is_refused_naming_the_field(value: Any, rule: str) -> None:
    with pytest.raises(SpecError) as err:
        _entries({"no_repeat_ngram_size": value})
    (problem,) = err.value.problems
    assert problem.path == "no_repeat_ngram_size" and problem.rule.startswith(rule), problem


def test_the_worker_policy_runs_it_under_the_same_allow_list() -> None:
    controls = with_controls(None, {"no_repeat_ngram_size": 2}, ALLOWED)
    policy = build_policy(DisaggregationMode.AGGREGATED, ALLOWED, lambda: None, 1000, environ={})
    (entry,) = policy.entries_for(controls.entries)
    assert entry.kind == "no_repeat_ngram" and entry.size == 2
