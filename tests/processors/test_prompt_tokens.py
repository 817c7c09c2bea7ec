"""``prompt_tokens`` (docs/specs.md): boost the request's own prompt tokens, or allow only them and
its stop tokens; built from ``logit_bias`` / ``allowed_tokens``, so it stays on the resident path."""

from __future__ import annotations

import pytest
import torch
from zoo_rows import EOS, V, apply, finite, largest_allocation, logits_row, realize, resident_and_host

from dynlogits import sdk
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.prompt_tokens import factory
from dynlogits.specs import decode_wire_payload

PROMPT = (3, 4, 4, 9, 3, V + 7)  # repeated ids count once; an id beyond the logits width is left out


def entry(**fields: object) -> object:
    (decoded,) = decode_wire_payload([{"kind": "prompt_tokens", **fields}])
    return decoded


def test_boost_adds_the_boost_once_to_every_distinct_prompt_token() -> None:
    p = factory(entry(mode="boost", boost=3.5), RealizeContext(vocab_size=V, prompt_ids=PROMPT, stop_token_ids=(EOS,)))
    expected = logits_row()
    expected[[3, 4, 9]] += 3.5
    for history in ([], [3, 3]):  # every step alike
        assert torch.allclose(apply(p, history), expected)


def test_boost_defaults_to_two() -> None:
    p = factory(entry(mode="boost"), RealizeContext(vocab_size=V, prompt_ids=(5,)))
    assert apply(p, [])[5] == pytest.approx(logits_row()[5].item() + 2.0)


def test_restrict_keeps_only_the_prompt_tokens_and_the_stop_tokens_with_their_values() -> None:
    p = factory(entry(mode="restrict"), RealizeContext(vocab_size=V, prompt_ids=PROMPT, stop_token_ids=(EOS, 12, V + 1)))
    row = apply(p, [3])
    assert finite(row) == [EOS, 3, 4, 9, 12]
    assert torch.equal(row[[EOS, 3, 4, 9, 12]], logits_row()[[EOS, 3, 4, 9, 12]])


def test_without_the_prompt_the_entry_cannot_be_realized() -> None:
    with pytest.raises(ValueError, match="needs the request's prompt"):
        factory(entry(mode="boost"), RealizeContext(vocab_size=V, stop_token_ids=(EOS,)))


def test_a_request_that_is_given_no_prompt_fails_at_realization_naming_the_entry() -> None:
    reports: list[str] = []
    request = sdk.realize([{"kind": "prompt_tokens", "mode": "restrict"}], vocab_size=V, stop_token_id=EOS,
                          report=reports.append)
    assert request is not None and request.failed
    assert "dynamo_logits[0]: could not realize kind 'prompt_tokens'" in reports[0]


@pytest.mark.parametrize("mode", ["boost", "restrict"])
def test_each_request_gets_fresh_processors_from_its_own_prompt(mode: str) -> None:
    a = factory(entry(mode=mode), RealizeContext(vocab_size=V, prompt_ids=(5,), stop_token_ids=(EOS,)))
    b = factory(entry(mode=mode), RealizeContext(vocab_size=V, prompt_ids=(6,), stop_token_ids=(EOS,)))
    assert a is not b
    assert not torch.equal(apply(a, []), apply(b, []))


@pytest.mark.parametrize("mode", ["boost", "restrict"])
def test_a_step_allocates_nothing_vocab_sized(mode: str) -> None:
    vocab = 100_000
    p = factory(entry(mode=mode), RealizeContext(vocab_size=vocab, prompt_ids=tuple(range(0, 300, 3)),
                                                stop_token_ids=(EOS,)))
    row = torch.zeros(vocab)
    p([], row)
    assert largest_allocation(lambda: p([], row)) < 4096


@pytest.mark.parametrize("mode", ["boost", "restrict"])
def test_the_request_is_resident_and_its_resident_rows_equal_the_host_paths(mode: str) -> None:
    facts = sdk.RequestFacts(prompt_ids=PROMPT, stop_token_ids=(EOS,))
    payload = [{"kind": "prompt_tokens", "mode": mode}]
    assert realize(payload, facts).resident
    for resident, host in resident_and_host(payload, [[], [3], [3, 9]], facts=facts):
        assert torch.equal(resident, host)


RESTRICT = {"kind": "prompt_tokens", "mode": "restrict"}


@pytest.mark.parametrize(("payload", "why"), [
    ([RESTRICT, {"kind": "banned_tokens", "token_ids": [3, 4, 9, EOS]}],
     "dynamo_logits[1]: contradicts the entries before it: it masks every token dynamo_logits[0] leaves allowed"),
    ([{"kind": "forced_sequence", "token_ids": [3, 5], "eos_token_id": EOS}, RESTRICT],
     "dynamo_logits[1]: contradicts the entries before it: it allows none of the tokens dynamo_logits[0] leaves "
     "allowed at output position 1"),
    ([{"kind": "multiple_choice", "choices": [[3, 9], [4, 6]], "eos_token_id": EOS}, RESTRICT],
     "it allows none of the tokens dynamo_logits[0] leaves allowed after the output [4] at output position 1"),
])
def test_a_restriction_the_other_entries_contradict_with_this_prompt_fails_at_realization_naming_both(
        payload: list[dict[str, object]], why: str) -> None:
    sdk.validate(payload)  # admission does not know the prompt
    reports: list[str] = []
    request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, report=reports.append,
                          facts=sdk.RequestFacts(prompt_ids=PROMPT, stop_token_ids=(EOS,)))
    assert request is not None and request.failed and len(reports) == 1
    assert why in reports[0] and "with this request's prompt: dynamo_logits[" in reports[0]


@pytest.mark.parametrize("payload", [
    [RESTRICT, {"kind": "banned_tokens", "token_ids": [3, 4, 9]}],  # the stop token is left
    [{"kind": "multiple_choice", "choices": [[3, 9], [4]], "eos_token_id": EOS}, RESTRICT],
    [RESTRICT, {"kind": "forced_sequence", "token_ids": [9, 3], "eos_token_id": EOS}],
    [{"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]},  # the two never meet
     {**RESTRICT, "scope": "answer"}, {"kind": "banned_tokens", "token_ids": [3, 4, 9, EOS], "scope": "reasoning"}],
    [{**RESTRICT, "mode": "boost"}, {"kind": "allowed_tokens", "token_ids": [5], "eos_token_id": EOS}],
])
def test_entries_the_prompt_leaves_a_token_are_realized(payload: list[dict[str, object]]) -> None:
    reports: list[str] = []
    request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, report=reports.append,
                          facts=sdk.RequestFacts(prompt_ids=PROMPT, stop_token_ids=(EOS,)))
    assert request is not None and not request.failed and not reports
