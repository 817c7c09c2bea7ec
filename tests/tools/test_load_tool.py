"""``dynlogits.tools.load`` without a server: the plans it sends, and the judge that must catch every fault.

The load test (``tests/deploy/test_load.py``) asserts zero cross-talk, loss and duplication; these
tests show the judge would report each of them if they happened.
"""

from __future__ import annotations

import pytest

from dynlogits.tools.load.driver import Answer, judge
from dynlogits.tools.load.plan import Mix, TokenPair, build_plans, load_token_pair
from dynlogits.tools.load.report import percentile, summarize

TOKENS = TokenPair(a_id=7, a_text=" the", b_id=9, b_text=" and")


def _plans() -> list:
    return build_plans(8, Mix.parse("forced=2,banned=1,bias=1,none=1"), stream_share=0.5, max_tokens=3, tokens=TOKENS)


def _right(plan, rid: str) -> Answer:  # noqa: ANN001
    return Answer(plan, text=plan.expected or "anything", finished=1, ids={rid}, completion_tokens=3, latency_ms=10)


def test_plans_mix_kinds_endpoints_and_streaming_and_expect_exact_texts() -> None:
    plans = _plans()
    assert [p.kind for p in plans[:5]] == ["forced", "banned", "bias", "none", "forced"]
    assert {p.endpoint for p in plans} == {"chat", "completion"}
    assert sum(p.stream for p in plans) == 4
    forced = [p for p in plans if p.kind == "forced"]
    assert len({p.expected for p in forced}) == len(forced)  # each forced text is its request's own
    bias = next(p for p in plans if p.kind == "bias")
    assert bias.expected == " the" * 3 and bias.entries[0]["bias"] == {"7": 100.0}
    banned = next(p for p in plans if p.kind == "banned")
    assert banned.expected == " and" * 3 and banned.entries[1] == {"kind": "banned_tokens", "token_ids": [7]}
    assert plans[0].request("m")["extra_body"]["logits_processors"][0]["kind"] == "forced_text"


def test_mix_errors_name_the_bad_item() -> None:
    with pytest.raises(ValueError, match="unknown kind 'forced_txt'"):
        Mix.parse("forced_txt=1")
    with pytest.raises(ValueError, match="at least one kind"):
        Mix.parse("forced=0")
    with pytest.raises(ValueError, match="needs the served model's tokenizer"):
        build_plans(3, Mix.parse("bias=1"), stream_share=0, max_tokens=2, tokens=None)


def test_the_judge_passes_right_answers() -> None:
    answers = [_right(p, f"id-{p.index}") for p in _plans()]
    assert {v.status for v in judge(answers)} == {"ok"}


@pytest.mark.parametrize(("fault", "status"), [
    ("swap two forced texts", "cross_talk"),
    ("an unforced request gets a forced text", "cross_talk"),
    ("a banned token comes back", "wrong_output"),
    ("no finished choice", "lost"),
    ("a choice finishes twice", "duplicated"),
    ("two requests share a response id", "duplicated"),
    ("an HTTP error", "error"),
])
def test_the_judge_reports_each_fault(fault: str, status: str) -> None:
    plans = _plans()
    answers = [_right(p, f"id-{p.index}") for p in plans]
    forced = [a for a in answers if a.plan.kind == "forced"]
    victim = {"swap two forced texts": forced[0], "an unforced request gets a forced text":
              next(a for a in answers if a.plan.kind == "none"),
              "a banned token comes back": next(a for a in answers if a.plan.kind == "banned")}.get(fault, answers[0])
    if fault == "swap two forced texts":
        forced[0].text, forced[1].text = forced[1].text, forced[0].text
    elif fault == "an unforced request gets a forced text":
        victim.text = forced[0].plan.expected
    elif fault == "a banned token comes back":
        victim.text = " the and and"
    elif fault == "no finished choice":
        victim.finished = 0
    elif fault == "a choice finishes twice":
        victim.finished = 2
    elif fault == "two requests share a response id":
        answers[1].ids = set(victim.ids)
    else:
        victim.error = "APIConnectionError: Connection error."
    verdicts = judge(answers)
    assert verdicts[answers.index(victim)].status == status
    summary = summarize(answers, verdicts, base_url="u", model="m", concurrency=2, duration_s=1.0)
    assert not summary.clean and summary.ok < summary.requests
    assert summary.samples and status in summary.samples[0]


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([], 50) == 0.0


def test_token_pair_from_the_embedded_tokenizer(embedded_model) -> None:  # noqa: ANN001
    pair = load_token_pair(embedded_model)
    assert pair.a_id != pair.b_id and pair.a_text.startswith(" ") and pair.b_text.startswith(" ")


def test_worker_stats_are_read_once_the_adapter_has_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker counts an aborted request out before the engine's next step releases the
    adapter's rows for it (seen in a CI run: 4 aborted ``n=16`` streams, 64 rows held at the first
    read); the summary's ``adapter_requests_after`` must not report that moment as a leak. The
    worker's answers are scripted here: the real sequence is in ``tests/deploy/test_faults.py``."""
    import dynlogits.tools.load.__main__ as main

    answers = iter([{"in_flight": 4, "adapter_requests": 64}, {"in_flight": 0, "adapter_requests": 64},
                    {"in_flight": 0, "adapter_requests": 0}])
    monkeypatch.setattr(main, "worker_stats", lambda _url: {"w": next(answers)})
    monkeypatch.setattr(main.time, "sleep", lambda _s: None)
    assert main._settled_stats("http://unused") == {"w": {"in_flight": 0, "adapter_requests": 0}}


def test_worker_stats_that_never_settle_are_reported_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    import dynlogits.tools.load.__main__ as main

    monkeypatch.setattr(main, "worker_stats", lambda _url: {"w": {"in_flight": 0, "adapter_requests": 3}})
    monkeypatch.setattr(main.time, "sleep", lambda _s: None)
    assert main._settled_stats("http://unused", wait_s=0.05) == {"w": {"in_flight": 0, "adapter_requests": 3}}


def test_costly_payloads_are_within_the_default_limits_and_distinct_per_request() -> None:
    from dynlogits.specs import DEFAULT_LIMITS, parse_entries
    from dynlogits.tools.load.costly import costly_payload

    first, again, other = costly_payload(7), costly_payload(7), costly_payload(8)
    assert first == again and first != other
    entries = parse_entries(first, root="logits_processors", limits=DEFAULT_LIMITS)
    assert [e.kind for e in entries].count("multiple_choice") == 7 and len(entries) <= DEFAULT_LIMITS.max_entries


def test_the_costly_report_holds_normal_p99_to_twice_alone_plus_a_second() -> None:
    from collections import Counter

    from dynlogits.tools.load.costly import CostlyOutcome
    from dynlogits.tools.load.driver import Answer
    from dynlogits.tools.load.report import CostlyReport

    plan = build_plans(1, Mix.parse("none=1"), stream_share=0, max_tokens=4, tokens=None)[0]
    alone = [Answer(plan, latency_ms=500.0)]
    costly = CostlyOutcome(Counter({400: 3}), [10.0, 20.0, 30.0])
    within = CostlyReport.of(2, alone, [Answer(plan, latency_ms=1900.0)], costly)
    assert within.bound_ms == 2000.0 and within.met and "met" in within.lines()[1]
    slow = CostlyReport.of(2, alone, [Answer(plan, latency_ms=2100.0)], costly)
    assert not slow.met and "NOT MET" in slow.lines()[1]
    refused = CostlyReport.of(2, alone, [Answer(plan, error="APIStatusError: busy", status=503)], costly)
    assert not refused.met and refused.beside_unavailable == 1
