"""The admission work budget (``dynlogits.specs.admission_work``): bounded from the payload's sizes
before any walk, refused naming the budget and the field that drives it, tunable by the operator;
realistic payloads stay well inside it. Timings are the bench's (``python -m dynlogits.tools.bench
admission``), not these tests'."""

from __future__ import annotations

import random
from typing import Any

import pytest
from spec_refusals import refusal

from dynlogits.policy.config import parse_config
from dynlogits.specs import SpecError, consistency
from dynlogits.specs.admission_work import admission_work
from dynlogits.specs.consistency import check_consistency, consistency_problems
from dynlogits.specs.effects import PhraseAutomaton
from dynlogits.specs.limits import DEFAULT_LIMITS, SpecLimits
from dynlogits.specs.wire import decode_entries
from dynlogits.tools.load.costly import costly_payload

REASONING = {"kind": "reasoning", "start_token_ids": [20], "end_token_ids": [21]}


def _walks_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(*_: Any, **__: Any) -> list[Any]:
        raise AssertionError("a consistency walk ran on a payload over the admission work budget")

    monkeypatch.setattr(consistency, "_problems", walked)


def test_the_issue_47_payload_is_refused_by_the_budget_naming_the_choices_before_any_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _walks_forbidden(monkeypatch)
    got = refusal(costly_payload(1))
    assert got.startswith("dynamo_logits[7].choices: admission would take ~")
    assert "dynamo_logits[7].choices: 16,320 tokens met by 7 entries" in got
    assert got.endswith(f"; the most allowed is {DEFAULT_LIMITS.max_admission_work:,} (limit max_admission_work)")


def test_an_operator_budget_decides_where_the_default_would_not() -> None:
    entries = decode_entries(costly_payload(2))
    generous = SpecLimits(max_admission_work=10**9)
    assert consistency_problems(entries, root="p", limits=generous) == []  # the walks admit it
    tight = SpecLimits(max_admission_work=1_000)
    small = decode_entries([{"kind": "banned_tokens", "token_ids": [5]},
                            {"kind": "forced_sequence", "token_ids": list(range(30, 330)), "eos_token_id": 2}])
    with pytest.raises(SpecError, match=r"^p\[1\]\.token_ids: admission would take .*limit max_admission_work\)$"):
        check_consistency(small, root="p", limits=tight)
    check_consistency(small, root="p")


def test_the_limit_is_read_from_the_operator_config() -> None:
    assert parse_config({"limits": {"max_admission_work": 5_000}}).limits.max_admission_work == 5_000
    assert parse_config({}).limits.max_admission_work == DEFAULT_LIMITS.max_admission_work
    with pytest.raises(SpecError, match="max_admission_work"):
        parse_config({"limits": {"max_admission_work": 0}})


@pytest.mark.parametrize("payload, field", [
    ([{"kind": "banned_tokens", "token_ids": [5]},
      *({"kind": "forced_sequence", "token_ids": list(range(30, 4126)), "eos_token_id": 2} for _ in range(12))],
     "dynamo_logits[12].token_ids"),
    ([{"kind": "forced_sequence", "token_ids": [7] * 4096, "eos_token_id": 2},
      *({"kind": "banned_phrases", "phrases": [[7] * 63 + [1000 + p + 256 * e] for p in range(256)]} for e in range(3))],
     "dynamo_logits[1].phrases"),
    ([{"kind": "banned_tokens", "token_ids": list(range(100, 4196))},
      *({"kind": "thinking_budget", "budget": 3, "start_token_ids": [5], "end_token_ids": list(range(5000 + e, 9096 + e))}
        for e in range(15))],
     "dynamo_logits[1].end_token_ids"),
], ids=["forced sequences", "phrases", "thinking budgets"])
def test_the_refusal_names_the_field_that_drives_the_work(payload: list[dict[str, Any]], field: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _walks_forbidden(monkeypatch)
    tight = SpecLimits(max_admission_work=50_000)
    with pytest.raises(SpecError) as err:
        check_consistency(decode_entries(payload), root="dynamo_logits", limits=tight)
    (problem,) = err.value.problems
    assert problem.path == field, problem


def _realistic(rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    def ids(k: int) -> list[int]:
        return sorted(rng.sample(range(1000, 150_000), k))

    return {
        "256 short choices beside bans and phrases": [
            {"kind": "banned_tokens", "token_ids": ids(100)}, {"kind": "banned_phrases", "phrases": [ids(3) for _ in range(20)]},
            {"kind": "multiple_choice", "choices": [ids(rng.randint(1, 4)) for _ in range(256)], "eos_token_id": 2},
            {"kind": "banned_tokens", "token_ids": ids(100)}],
        "a forced sequence beside phrase bans": [
            {"kind": "forced_sequence", "token_ids": ids(300), "eos_token_id": 2},
            *({"kind": "banned_phrases", "phrases": [ids(4) for _ in range(50)]} for _ in range(3))],
        "4096-id sets": [REASONING, {"kind": "banned_tokens", "token_ids": ids(4096)},
                         {"kind": "allowed_tokens", "token_ids": ids(4096), "eos_token_id": 2},
                         {"kind": "min_tokens", "min_tokens": 16, "stop_token_ids": ids(4096)},
                         {"kind": "thinking_budget", "budget": 512},
                         {"kind": "forced_sequence", "token_ids": ids(64), "eos_token_id": 2, "scope": "answer"}],
    }


def test_realistic_payloads_stay_well_inside_the_default_budget() -> None:
    for name, payload in _realistic(random.Random(1)).items():
        units = admission_work(decode_entries(payload), 151_936).units
        assert units < DEFAULT_LIMITS.max_admission_work // 4, (name, units)


def test_payloads_the_rules_never_walk_cost_only_their_entries() -> None:
    phrases = [{"kind": "banned_phrases", "phrases": [list(range(64 * p, 64 * p + 64)) for p in range(256)]}
               for _ in range(16)]
    assert admission_work(decode_entries(phrases)).units < 1_000


def test_the_phrase_automaton_masks_exactly_what_the_phrases_say() -> None:
    """Brute force: after an output, a phrase masks its last token where the output ends with the
    rest of it; ``step``/``hits``/``shortest``/``masked`` must say the same at every prefix."""
    rng = random.Random(2)
    for _ in range(300):
        groups = [[[rng.randint(1, 4) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 4))]
                  for _ in range(rng.randint(1, 3))]
        automaton, single = PhraseAutomaton(groups), PhraseAutomaton(groups[:1])
        output = [rng.randint(1, 4) for _ in range(12)]
        state = one = 0
        for n in range(len(output) + 1):
            written = output[:n]
            for token in range(1, 5):
                ends = [g for g, phrases in enumerate(groups)
                        if any(p[-1] == token and len(p) - 1 <= n and written[n - len(p) + 1:] == p[:-1] for p in phrases)]
                assert [g for g in range(len(groups)) if automaton.hits[automaton.step(state, token)] >> g & 1] == ends
            expected = {p[-1] for p in groups[0] if len(p) - 1 <= n and written[n - len(p) + 1:] == p[:-1]}
            assert single.masked(one) == expected
            if n < len(output):
                state, one = automaton.step(state, output[n]), single.step(one, output[n])
                done = [k for k, p in enumerate(groups[0]) if output[n + 1 - len(p):n + 1] == p and len(p) <= n + 1]
                shortest = min(done, key=lambda k: (len(groups[0][k]), k)) if done else None
                assert single.shortest[one] == shortest


class _Counted:
    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_a_payload_is_walked_once_per_process_whatever_each_caller_names_its_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    walks = _Counted(consistency._problems)
    monkeypatch.setattr(consistency, "_problems", walks)
    consistency.VERDICTS.clear()
    entries = decode_entries([{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": 2},
                              {"kind": "banned_tokens", "token_ids": [7, 5, 6]}])
    worker = consistency_problems(entries, paths=["deployment entries[0]", "logits_processors[0]"])
    engine = consistency_problems(entries, root="dynamo_logits")
    assert walks.calls == 1
    assert [p.path for p in worker] == ["logits_processors[0]"]
    assert "deployment entries[0]" in worker[0].rule
    assert [p.path for p in engine] == ["dynamo_logits[1]"]
    assert "dynamo_logits[0]" in engine[0].rule and "deployment" not in engine[0].rule
    consistency_problems(entries, root="dynamo_logits", vocab_size=64)  # another width: another verdict
    assert walks.calls == 2


def test_the_verdict_memo_is_bounded_by_count_and_by_the_bytes_of_its_keys() -> None:
    verdicts = consistency._Verdicts(3, 100)
    for key in (b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10):
        verdicts.put(key, ())
    assert verdicts.get(b"a" * 10) is None and verdicts.get(b"d" * 10) == ()  # the oldest went first
    verdicts.put(b"e" * 90, ())
    assert verdicts.get(b"b" * 10) is None and verdicts.get(b"c" * 10) is None and verdicts.get(b"e" * 90) == ()
    verdicts.put(b"f" * 101, ())  # a key over the bound is not kept
    assert verdicts.get(b"f" * 101) is None and verdicts.get(b"e" * 90) == ()


def test_the_admission_bench_times_its_realistic_payloads_inside_the_budget() -> None:
    from dynlogits.tools.bench.admission import CASES, run, table

    rows = run(DEFAULT_LIMITS, repeats=1, cases=[c for c in CASES if c.realistic])
    assert rows and all(r.verdict != "budget" and r.units < DEFAULT_LIMITS.max_admission_work // 3 for r in rows), rows
    assert len(table(rows, DEFAULT_LIMITS)) == len(rows) + 2


def test_entries_admitted_against_a_width_are_admitted_without_one_with_no_second_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker checks against the logits width, vLLM's input validation in the same process
    without it (it does not know the width): the second finds the first's verdict."""
    walks = _Counted(consistency._problems)
    monkeypatch.setattr(consistency, "_problems", walks)
    consistency.VERDICTS.clear()
    entries = decode_entries([{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": 2},
                              {"kind": "banned_tokens", "token_ids": [9]}])
    assert consistency_problems(entries, root="logits_processors", vocab_size=1000) == []
    assert consistency_problems(entries, root="dynamo_logits") == []
    assert walks.calls == 1
    refused = decode_entries([{"kind": "multiple_choice", "choices": [[5, 6], [7]], "eos_token_id": 2},
                              {"kind": "banned_tokens", "token_ids": [7, 5]}])
    assert consistency_problems(refused, root="p", vocab_size=1000) and consistency_problems(refused, root="p")
    assert walks.calls == 3  # a refusal is kept for its own width only


def test_a_kept_verdict_is_answered_even_where_the_callers_budget_is_smaller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget bounds walks: a verdict kept in this process (the worker admitted it under the
    operator's budget) costs none, so vLLM's validation under the default budget answers it too."""
    consistency.VERDICTS.clear()
    entries = decode_entries(costly_payload(3))
    assert consistency_problems(entries, root="p", limits=SpecLimits(max_admission_work=10**9)) == []
    _walks_forbidden(monkeypatch)
    assert consistency_problems(entries, root="p", limits=SpecLimits(max_admission_work=1_000)) == []
