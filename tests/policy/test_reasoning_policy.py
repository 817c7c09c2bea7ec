"""A deployment's reasoning delimiters (operator ``reasoning:``, else the model folder's default) join
every request that activates entries, resolved with the worker's tokenizer; a request's own
``reasoning`` entry replaces them unless the deployment's entries act by them (refused: see
``test_operator_entries.py``); both spec sources (worker and engine) apply the same rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynlogits.model_builder import build_model, model_reasoning
from dynlogits.policy.config import parse_config, parse_reasoning
from dynlogits.policy.engine_spec import resolve_engine_spec
from dynlogits.policy.request import build_policy
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import SpecError

VOCAB = 1024
AGG = DisaggregationMode.AGGREGATED
THINK = {"start_text": "<think>", "end_text": "</think>"}


@pytest.fixture(scope="module")
def reasoning_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("reasoning") / "model", reasoning=True)


@pytest.fixture(scope="module")
def tokenizer(reasoning_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(reasoning_model))


@pytest.fixture(scope="module")
def think(tokenizer: Any) -> tuple[int, int]:
    (start,), (end,) = (tokenizer.encode(t, add_special_tokens=False) for t in ("<think>", "</think>"))
    return start, end


def _policy(config: dict[str, Any], tokenizer: Any, role: DisaggregationMode = AGG, **kwargs: Any) -> Any:
    return build_policy(role, parse_config(config), lambda: tokenizer, VOCAB, environ={}, **kwargs)


def _kinds(entries: list[Any]) -> list[str]:
    return [e.kind for e in entries]


def test_the_operators_reasoning_leads_every_request_that_activates_entries(tokenizer, think) -> None:
    policy = _policy({"reasoning": THINK, "allow_request_kinds": ["thinking_budget", "banned_tokens"]}, tokenizer)
    entries = policy.entries_for([{"kind": "thinking_budget", "budget": 8}])  # the deployment's delimiters
    assert _kinds(entries) == ["reasoning", "thinking_budget"]
    assert (entries[0].start_token_ids, entries[0].end_token_ids) == ((think[0],), (think[1],))
    assert policy.entries_for(None) == []  # nothing activated, nothing added


def test_the_deployments_own_entries_get_the_reasoning_and_prefill_gets_nothing(tokenizer) -> None:
    config = {"reasoning": THINK, "entries": [{"kind": "banned_tokens", "token_ids": [7], "scope": "answer"}]}
    assert _kinds(_policy(config, tokenizer).entries_for(None)) == ["reasoning", "banned_tokens"]
    assert _policy(config, tokenizer, DisaggregationMode.PREFILL).entries_for(None) == []


def test_a_requests_own_reasoning_entry_replaces_the_deployments(tokenizer) -> None:
    policy = _policy({"reasoning": THINK, "allow_request_kinds": ["reasoning", "thinking_budget"]}, tokenizer)
    entries = policy.entries_for([{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]},
                                  {"kind": "thinking_budget", "budget": 2}])
    assert _kinds(entries) == ["reasoning", "thinking_budget"] and entries[0].start_token_ids == (5,)


def test_a_config_entry_declaring_reasoning_is_replaced_by_the_requests_too(tokenizer) -> None:
    config = {"entries": [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]},
                          {"kind": "banned_tokens", "token_ids": [7]}],
              "allow_request_kinds": ["reasoning"]}
    entries = _policy(config, tokenizer).entries_for([{"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]}])
    assert [e.start_token_ids for e in entries if e.kind == "reasoning"] == [(8,)]


def test_without_reasoning_delimiters_a_thinking_budget_without_its_own_is_refused_naming_it(tokenizer) -> None:
    policy = _policy({"allow_request_kinds": ["thinking_budget"]}, tokenizer)
    with pytest.raises(SpecError, match=r"logits_processors\[0\]: thinking_budget has no delimiters of its own"):
        policy.entries_for([{"kind": "thinking_budget", "budget": 8}])


def test_the_models_default_applies_unless_the_operator_sets_one(tokenizer, think, reasoning_model) -> None:
    default = parse_reasoning(model_reasoning(reasoning_model), source="model")
    policy = _policy({"allow_request_kinds": ["thinking_budget"]}, tokenizer, default_reasoning=default)
    assert policy.entries_for([{"kind": "thinking_budget", "budget": 8}])[0].start_token_ids == (think[0],)
    operator = _policy({"reasoning": {"start_token_ids": [5], "end_token_ids": [6]}, "allow_request_kinds": ["thinking_budget"]},
                       tokenizer, default_reasoning=default)
    assert operator.entries_for([{"kind": "thinking_budget", "budget": 8}])[0].start_token_ids == (5,)


def test_scoped_entries_of_the_request_and_the_deployment_are_checked_together_by_phase(tokenizer) -> None:
    config = {"reasoning": THINK, "entries": [{"kind": "banned_tokens", "token_ids": [7], "scope": "reasoning"}],
              "allow_request_kinds": ["forced_sequence"]}
    policy = _policy(config, tokenizer)
    policy.entries_for([{"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 1, "scope": "answer"}])
    with pytest.raises(SpecError, match=r"logits_processors\[0\]: contradicts the entries before it: it forces token 7 at "
                                        r"reasoning position 0, which an earlier entry masks"):
        policy.entries_for([{"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 1, "scope": "reasoning"}])


def test_a_config_names_a_bad_reasoning_field() -> None:
    with pytest.raises(SpecError, match=r"^reasoning: give end_token_ids \(token ids\) or end_text"):
        parse_config({"reasoning": {"start_text": "<think>"}})
    with pytest.raises(SpecError, match=r"^reasoning: the entries declare reasoning delimiters already"):
        parse_config({"reasoning": THINK, "entries": [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]}]})


def test_the_engine_as_spec_source_applies_the_same_rule(tmp_path, tokenizer, think) -> None:
    config = tmp_path / "spec.yaml"
    config.write_text("reasoning: {start_text: '<think>', end_text: '</think>'}\nallow_request_kinds: [thinking_budget]\n")
    spec = resolve_engine_spec(AGG, lambda: tokenizer, VOCAB, {"DYN_LOGITS_SPEC_SOURCE": "engine", "DYN_LOGITS_SPEC": str(config)})
    assert spec is not None
    payload = spec.payload_for([{"kind": "thinking_budget", "budget": 3}])
    assert payload is not None and [e["kind"] for e in payload] == ["reasoning", "thinking_budget"]
    assert payload[0] == {"kind": "reasoning", "start_token_ids": [think[0]], "end_token_ids": [think[1]]}
