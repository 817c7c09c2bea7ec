"""A client can neither switch the deployment's entries off nor escape them, and its limits count
only its own entries (issue 47, items 3 and 6), on the worker's request policy:

* a request without a stop token (``ignore_eos``, no stop ids) is refused at admission when an entry
  needs one, the client's own (named at its path) or the deployment's (named, under ``ignore_eos``);
* a client's ``reasoning`` entry is refused where the deployment's entries act by the delimiters;
* a client's ``max_entries`` counts its own entries; the engine's bound on the whole payload counts
  the deployment's apart; every limit is refused before any consistency walk runs."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits import sdk
from dynlogits.policy import request as request_module
from dynlogits.policy.config import parse_config
from dynlogits.policy.request import build_policy, needs_stop_token
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.specs import DEFAULT_LIMITS, SpecError, encode_entries
from dynlogits.specs.wire import payload_max_entries

VOCAB = 1024
AGG = DisaggregationMode.AGGREGATED
THINK = {"start_token_ids": [5], "end_token_ids": [6]}
EVERY_KIND = ["forced_sequence", "banned_tokens", "allowed_tokens", "logit_bias", "min_tokens", "thinking_budget",
              "reasoning", "multiple_choice", "trigger", "deadline", "prompt_tokens", "banned_phrases"]
#: The operator entries of ``tests/deploy/open_deployment.yaml`` (a ban, a ban scoped to the answer).
OPERATOR = [{"kind": "banned_tokens", "token_ids": [735, 450]}, {"kind": "banned_tokens", "token_ids": [300], "scope": "answer"}]
DEADLINE = {"kind": "deadline", "seconds": 30.0}
CHOICE_IDS = {"kind": "multiple_choice", "choices": [[7, 8], [9]]}


def _policy(tokenizer: Any, entries: list[dict[str, Any]] | None = None, role: DisaggregationMode = AGG,
            reasoning: dict[str, Any] | None = THINK) -> Any:
    config: dict[str, Any] = {"allow_request_kinds": EVERY_KIND, "entries": entries or []}
    if reasoning is not None:
        config["reasoning"] = reasoning
    return build_policy(role, parse_config(config), lambda: tokenizer, VOCAB, environ={})


# -- ignore_eos -------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry", [DEADLINE, CHOICE_IDS], ids=["deadline", "multiple_choice ids without eos"])
def test_a_clients_entry_that_needs_a_stop_token_is_refused_under_ignore_eos_naming_both(embedded_tokenizer, entry) -> None:
    policy = _policy(embedded_tokenizer, OPERATOR)
    policy.entries_for([entry])  # with its EOS the request has a stop token
    with pytest.raises(SpecError) as info:
        policy.entries_for([{"kind": "banned_tokens", "token_ids": [3]}, entry], ignore_eos=True)
    (problem,) = info.value.problems
    assert problem.path == "logits_processors[1]"
    assert entry["kind"] in problem.rule and "ignore_eos" in problem.rule and "stop token" in problem.rule


def test_an_explicit_stop_id_is_a_stop_token_under_ignore_eos(embedded_tokenizer) -> None:
    policy = _policy(embedded_tokenizer, [DEADLINE])
    assert [e.kind for e in policy.entries_for([DEADLINE], ignore_eos=True, stop_token_ids=[2])] == ["reasoning", "deadline",
                                                                                                    "deadline"]


def test_the_deployments_entry_that_needs_a_stop_token_refuses_ignore_eos_naming_the_entry(embedded_tokenizer) -> None:
    """Without a stop token the operator's deadline could not be realized, so ``ignore_eos`` would
    switch it (and, before, every other deployment entry) off: refused, with or without own entries."""
    policy = _policy(embedded_tokenizer, [*OPERATOR, DEADLINE])
    for own in (None, [{"kind": "banned_tokens", "token_ids": [3]}]):
        with pytest.raises(SpecError) as info:
            policy.entries_for(own, ignore_eos=True)
        (problem,) = info.value.problems
        assert problem.path == "ignore_eos" and "deployment entries[2] (deadline)" in problem.rule


def test_entries_that_bring_their_own_end_are_admitted_under_ignore_eos(embedded_tokenizer) -> None:
    policy = _policy(embedded_tokenizer, OPERATOR)
    own = [{**CHOICE_IDS, "eos_token_id": 2}, {"kind": "multiple_choice", "texts": ["yes", "no"]},
           {"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 2}]
    kinds = [e.kind for e in policy.entries_for(own[:1], ignore_eos=True)]
    assert kinds == ["reasoning", "banned_tokens", "banned_tokens", "multiple_choice"]
    policy.entries_for(own[1:2], ignore_eos=True)
    policy.entries_for(own[2:], ignore_eos=True)


def test_a_prefill_worker_activates_nothing_so_refuses_nothing_under_ignore_eos(embedded_tokenizer) -> None:
    assert _policy(embedded_tokenizer, [DEADLINE], DisaggregationMode.PREFILL).entries_for(None, ignore_eos=True) == []


def test_every_kind_whose_factory_needs_a_stop_token_is_named_by_the_rule() -> None:
    """``needs_stop_token`` against the factories themselves: every entry of the valid golden
    vectors (and the multiple_choice forms) is realized with and without a stop id; exactly those
    the rule names fail without one."""
    from dynlogits.processors import RealizeContext
    from dynlogits.processors.registry import factory_for
    from dynlogits.specs.schema import golden_vectors
    from dynlogits.specs.wire import decode_wire_payload

    payloads = [v["payload"] for _, v in golden_vectors() if v["valid"] and v["payload"]]
    payloads.append([CHOICE_IDS, {**CHOICE_IDS, "eos_token_id": 1}, DEADLINE])
    seen: set[tuple[str, bool]] = set()
    for payload in payloads:
        entries = decode_wire_payload(payload)
        reasoning = next(((tuple(e.start_token_ids), tuple(e.end_token_ids)) for e in entries if e.kind == "reasoning"),
                         ((5,), (6,)))
        for entry in entries:
            if entry.kind in ("reasoning", "python"):
                continue
            kwargs: dict[str, Any] = {"vocab_size": VOCAB, "prompt_ids": (3, 4), "reasoning": reasoning}
            factory_for(entry.kind)(entry, RealizeContext(stop_token_ids=(1,), **kwargs))  # realizes with one
            try:
                factory_for(entry.kind)(entry, RealizeContext(stop_token_ids=(), **kwargs))
                needs = False
            except ValueError:
                needs = True
            assert needs == needs_stop_token(entry), entry
            seen.add((entry.kind, needs))
    assert {("deadline", True), ("multiple_choice", True), ("multiple_choice", False)} <= seen


# -- reasoning --------------------------------------------------------------------------------------
@pytest.mark.parametrize("operator, named", [
    (OPERATOR, "deployment entries[1] (banned_tokens, scope answer)"),
    ([{"kind": "thinking_budget", "budget": 4}], "deployment entries[0] (thinking_budget, on the deployment's delimiters)"),
], ids=["scoped ban", "thinking_budget on the delimiters"])
def test_a_clients_reasoning_entry_is_refused_where_the_deployments_entries_act_by_the_delimiters(
        embedded_tokenizer, operator, named) -> None:
    policy = _policy(embedded_tokenizer, operator)
    with pytest.raises(SpecError) as info:
        policy.entries_for([{"kind": "banned_tokens", "token_ids": [3]},
                            {"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]}])
    (problem,) = info.value.problems
    assert problem.path == "logits_processors[1]" and named in problem.rule and "reasoning delimiters" in problem.rule


def test_the_scoped_entries_of_a_deployment_without_delimiters_are_held_too(embedded_tokenizer) -> None:
    """Without delimiters an entry scoped to the answer acts at every step: a client's reasoning
    entry would open a phase where it does not."""
    policy = _policy(embedded_tokenizer, OPERATOR, reasoning=None)
    with pytest.raises(SpecError, match=r"^logits_processors\[0\]: a request's reasoning entry"):
        policy.entries_for([{"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]}])


def test_a_clients_reasoning_entry_still_replaces_delimiters_no_deployment_entry_acts_by(embedded_tokenizer) -> None:
    policy = _policy(embedded_tokenizer, OPERATOR[:1])
    entries = policy.entries_for([{"kind": "reasoning", "start_token_ids": [8], "end_token_ids": [9]},
                                  {"kind": "banned_tokens", "token_ids": [3], "scope": "answer"}])
    assert [(e.kind, getattr(e, "start_token_ids", None)) for e in entries] == [
        ("banned_tokens", None), ("reasoning", (8,)), ("banned_tokens", None)]


# -- limits -----------------------------------------------------------------------------------------
def _bans(n: int) -> list[dict[str, Any]]:
    return [{"kind": "banned_tokens", "token_ids": [10 + i]} for i in range(n)]


@pytest.mark.parametrize("own", [15, DEFAULT_LIMITS.max_entries])
def test_a_clients_max_entries_counts_its_own_entries_only(embedded_tokenizer, own: int) -> None:
    """16 of a client's own beside the deployment's 2 and its reasoning entry: admitted by the
    worker and by the engine's check of the whole payload (``sdk.validate``, the default limits)."""
    payload = encode_entries(_policy(embedded_tokenizer, OPERATOR).entries_for(_bans(own)))
    assert len(payload) == own + 3
    sdk.validate(payload, vocab_size=VOCAB)


def test_one_entry_over_the_clients_limit_is_refused_naming_its_field_before_any_walk(
        embedded_tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = _policy(embedded_tokenizer, OPERATOR)

    def walk(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a consistency walk ran before the limit was checked")

    monkeypatch.setattr(request_module, "check_consistency", walk)
    with pytest.raises(SpecError) as info:
        policy.entries_for(_bans(DEFAULT_LIMITS.max_entries + 1))
    (problem,) = info.value.problems
    assert problem.path == "logits_processors" and "at most 16 entries (limit max_entries)" in problem.rule


def test_the_engines_bound_on_a_whole_payload_still_holds() -> None:
    bound = payload_max_entries(DEFAULT_LIMITS)
    assert bound == 2 * DEFAULT_LIMITS.max_entries + 2
    sdk.validate(_bans(bound))
    with pytest.raises(SpecError, match=rf"^dynamo_logits: must have at most {bound} entries \(a client's max_entries, 16"):
        sdk.validate(_bans(bound + 1))
