"""``dry``: llama.cpp's DRY penalty. Hand-computed golden cases (the same as docs/specs.md's), the
processor against a literal restatement of llama.cpp's algorithm (``dynlogits.testing.dry_reference``:
its Z-algorithm, its breaker matching) on random histories and vocabularies, breakers resolved on the
embedded model's real tokenizer, placeholders, several rows per instance, the row's dtypes, and the
limits refused naming the field before any work."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from dynlogits.processors.base import RealizeContext
from dynlogits.processors.dry import DryProcessor, breakers_of, factory, max_exponent
from dynlogits.processors.vocabulary import Vocabulary, tokenizer_strings
from dynlogits.sdk import apply_rows, realize
from dynlogits.sdk.realization import RequestFacts
from dynlogits.specs import SpecError, decode_wire_payload, parse_entries
from dynlogits.specs.builtin.dry import MAX_DRY_BREAKER_CHARS, MAX_DRY_BREAKERS, MAX_DRY_LOOKBACK, DrySpec
from dynlogits.testing.dry_reference import LOOKBACK_ALL, dry_penalties, resolve_breakers

#: a small vocabulary: ``:`` (3) breaks alone; ``<`` (4) breaks when ``br>`` (5) follows ("<br>")
VOCAB = ("a", "b", "c", ":", "<", "br>", "y", "<br>", "d")
A, B, C, COLON, LT, BR, Y = 0, 1, 2, 3, 4, 5, 6

#: (what, entry fields, prompt, history, expected {id: penalty}); multiplier 1, base 2 unless said.
GOLDEN: list[tuple[str, dict[str, Any], list[int], list[int], dict[int, float]]] = [
    ("llama.cpp's own example a b c c b c y a b c: c extends 'a b c' (3), y extends 'b c' (2); "
     "b extends only 'c' (1 < allowed_length)",
     {}, [], [A, B, C, C, B, C, Y, A, B, C], {C: 2.0, Y: 1.0}),
    ("allowed_length 3: only the 3-token repeat counts, at exponent 0",
     {"allowed_length": 3}, [], [A, B, C, C, B, C, Y, A, B, C], {C: 1.0}),
    ("a breaker token is never penalized: ':' would extend 'a b c' (3)",
     {"sequence_breakers": [":"]}, [], [A, B, C, COLON, A, B, C], {}),
    ("without the breaker the same ':' loses 2 ** (3 - 2)",
     {"sequence_breakers": []}, [], [A, B, C, COLON, A, B, C], {COLON: 2.0}),
    ("a breaker stops a repeat from reaching back past it: 'b : a b' repeats 4 tokens, but only 'a b' "
     "follows the last ':'",
     {"sequence_breakers": [":"]}, [], [B, COLON, A, B, Y, B, COLON, A, B], {Y: 1.0}),
    ("the same without breakers: y extends a 4-token repeat",
     {"sequence_breakers": []}, [], [B, COLON, A, B, Y, B, COLON, A, B], {Y: 4.0}),
    ("a two-token breaker ('<' then 'br>') limits the repeat to the 'a b' after it",
     {"sequence_breakers": ["<br>"]}, [], [A, B, LT, BR, A, B, LT, BR, A, B], {LT: 1.0}),
    ("the same without breakers: '<' extends a 6-token repeat",
     {"sequence_breakers": []}, [], [A, B, LT, BR, A, B, LT, BR, A, B], {LT: 16.0}),
    ("the prompt counts: prompt a b c, output a b: c extends 'a b'",
     {}, [A, B, C], [A, B], {C: 1.0}),
    ("include_prompt false: the output alone (2 tokens) is not longer than allowed_length",
     {"include_prompt": False}, [A, B, C], [A, B], {}),
    ("penalty_last_n 4: the window b c a b holds no earlier 'a b'",
     {"penalty_last_n": 4}, [A, B, C], [A, B], {}),
    ("penalty_last_n 0 is off", {"penalty_last_n": 0}, [], [A, B, C, C, B, C, Y, A, B, C], {}),
    ("multiplier 0 is off", {"multiplier": 0.0}, [], [A, B, C, C, B, C, Y, A, B, C], {}),
    ("a placeholder in the newest slot: the last token is not known, nothing repeats",
     {}, [], [A, B, C, A, B, -1], {}),
    ("a placeholder inside the window matches nothing: 'a b' before it, only 'b' after it",
     {}, [], [A, B, C, A, -1, B], {}),
]


def _entry(fields: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "dry", "multiplier": 1.0, "base": 2.0, "sequence_breakers": [], **fields}


def _processor(entry: dict[str, Any], prompt: list[int], vocabulary: tuple[str, ...] | None = VOCAB) -> DryProcessor:
    spec = DrySpec.model_validate(entry)
    ctx = RealizeContext(len(vocabulary or VOCAB), prompt_ids=tuple(prompt),
                         tokenizer_vocabulary=None if vocabulary is None else Vocabulary(lambda: vocabulary))
    return factory(spec, ctx)


def _penalties(processor: DryProcessor, history: list[int], width: int) -> dict[int, float]:
    ids, pens = processor.penalties(history, width)
    return dict(zip(ids.tolist(), pens.tolist()))


@pytest.mark.parametrize(("what", "fields", "prompt", "history", "expected"), GOLDEN, ids=[g[0][:40] for g in GOLDEN])
def test_golden_histories_get_the_hand_computed_penalties(what: str, fields: dict[str, Any], prompt: list[int],
                                                          history: list[int], expected: dict[int, float]) -> None:
    entry = _entry(fields)
    assert _penalties(_processor(entry, prompt), history, len(VOCAB)) == expected
    assert dry_penalties(entry, [*prompt, *history] if entry.get("include_prompt", True) else history, VOCAB) == expected


def test_the_processor_subtracts_the_penalties_in_place_and_leaves_masks_alone() -> None:
    processor = _processor(_entry({}), [])
    row = torch.zeros(len(VOCAB))
    row[Y] = float("-inf")
    processor([A, B, C, C, B, C, Y, A, B, C], row)
    expected = torch.zeros(len(VOCAB))
    expected[C], expected[Y] = -2.0, float("-inf")
    assert torch.equal(row, expected)


def _random_case(rng: random.Random, vocab_size: int) -> tuple[list[int], list[int]]:
    alphabet = rng.randint(1, vocab_size)
    history: list[int] = []
    length = rng.choice([0, 3, 10, 40, 120])
    while len(history) < length:  # copies of earlier stretches, so repeats are common
        if history and rng.random() < 0.5:
            start = rng.randrange(len(history))
            history += history[start : start + rng.randint(1, 12)]
        else:
            history.append(rng.randrange(alphabet))
    history = history[:length]
    if history and rng.random() < 0.2:
        history[-1] = -1
    if len(history) > 4 and rng.random() < 0.1:
        history[rng.randrange(len(history) - 1)] = -1
    return [rng.randrange(alphabet) for _ in range(rng.randint(0, 8))], history


def test_the_processor_agrees_with_llama_cpps_algorithm_on_random_histories() -> None:
    rng = random.Random(50)
    breaker_sets = [[], ["\n", ":", '"', "*"], [":"], ["<br>"], ["br>"], [":", "<br>", "c"]]
    for _ in range(1500):
        prompt, history = _random_case(rng, len(VOCAB))
        entry = {"kind": "dry", "multiplier": rng.choice([0.0, 0.8, 3.0]),
                 "base": rng.choice([1.0, 1.0000005, 1.75, 3.0, 100.0]), "allowed_length": rng.randint(1, 5),
                 "penalty_last_n": rng.choice([-1, 0, 1, 4, 16, 64]), "sequence_breakers": rng.choice(breaker_sets),
                 "include_prompt": rng.random() < 0.7}
        got = _penalties(_processor(entry, prompt), history, len(VOCAB))
        want = dry_penalties(entry, [*prompt, *history] if entry["include_prompt"] else history, VOCAB)
        assert got.keys() == want.keys(), (entry, prompt, history)
        for token, penalty in want.items():
            assert got[token] == pytest.approx(penalty, rel=1e-12), (entry, prompt, history)


def test_a_long_loop_at_the_largest_look_back_agrees_too() -> None:
    rng = random.Random(7)
    loop = [rng.randrange(len(VOCAB)) for _ in range(37)]
    history = (loop * 80)[: MAX_DRY_LOOKBACK + 100]
    for base, breakers in ((1.0, [":"]), (1.0, []), (1.75, []), (1.75, [":"]), (100.0, [])):
        entry = _entry({"base": base, "sequence_breakers": breakers})
        got = _penalties(_processor(entry, []), history, len(VOCAB))
        want = dry_penalties(entry, history, VOCAB)
        assert got.keys() == want.keys() and got
        assert all(got[t] == pytest.approx(p, rel=1e-12) for t, p in want.items())
    assert LOOKBACK_ALL == MAX_DRY_LOOKBACK


def test_the_exponent_is_clamped_as_llama_cpp_clamps_it() -> None:
    assert max_exponent(1.0) == 0 and max_exponent(1.000001) == 0
    assert max_exponent(1.75) == 158 and max_exponent(2.0) == 128 and max_exponent(100.0) == 19


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_huge_penalty_leaves_a_finite_logit_finite_in_the_rows_dtype(dtype: torch.dtype) -> None:
    processor = _processor(_entry({"multiplier": 100.0, "base": 100.0}), [])
    history = [A, B, C] * 30
    row = torch.full((len(VOCAB),), 3.0, dtype=dtype)
    processor(history, row)
    assert torch.isfinite(row).all()
    assert float(row[A]) == torch.finfo(dtype).min and float(row[B]) == 3.0


def test_one_instance_serves_interleaved_rows_as_fresh_ones_would() -> None:
    rng = random.Random(3)
    entry = _entry({"sequence_breakers": [":", "<br>"]})
    shared = _processor(entry, [A, B])
    for _ in range(200):
        _, history = _random_case(rng, len(VOCAB))
        assert _penalties(shared, history, len(VOCAB)) == _penalties(_processor(entry, [A, B]), history, len(VOCAB))


def test_ids_past_the_row_are_never_indexed() -> None:
    processor = _processor(_entry({}), [])
    row = torch.zeros(3)  # narrower than the history's ids
    processor([A, B, Y, A, B, Y, A, B], row)
    assert torch.equal(row, torch.zeros(3))


def test_breakers_need_the_vocabulary_and_none_run_without_one() -> None:
    with pytest.raises(ValueError, match="sequence_breakers are matched against the tokenizer's vocabulary"):
        _processor(_entry({"sequence_breakers": [":"]}), [], vocabulary=None)
    processor = _processor(_entry({"sequence_breakers": []}), [], vocabulary=None)
    assert _penalties(processor, [A, B, C, A, B], len(VOCAB)) == {C: 1.0}


def test_realization_with_the_default_breakers_reads_the_engines_vocabulary() -> None:
    loaded: list[int] = []

    def load() -> tuple[str, ...]:
        loaded.append(1)
        return VOCAB

    vocabulary = Vocabulary(load)
    request = realize([{"kind": "dry", "multiplier": 1.0, "base": 2.0}], vocab_size=len(VOCAB), stop_token_id=None,
                      facts=RequestFacts.of(prompt_ids=[], eos_token_id=None, vocabulary=vocabulary))
    assert request is not None and loaded == [1]
    logits = torch.zeros(1, len(VOCAB))
    apply_rows(logits, [0], [request], [[A, B, C, COLON, A, B, C]])  # ':' breaks (default breakers): no penalty
    assert torch.equal(logits, torch.zeros(1, len(VOCAB)))
    apply_rows(logits, [0], [request], [[A, B, C, A, B, C]])
    assert logits[0].tolist() == [-2.0 if i == A else 0.0 for i in range(len(VOCAB))]


def test_breakers_resolve_on_a_real_tokenizer_as_llama_cpp_resolves_them(embedded_tokenizer: Any) -> None:
    vocabulary = tuple(tokenizer_strings(embedded_tokenizer))
    for breakers in (["\n", ":", '"', "*"], ["\n\n"], ['":'], ["###"], [" {\""]):
        ours = breakers_of(vocabulary, breakers)
        pairs = resolve_breakers(breakers, vocabulary)
        assert {(h, t) for h, tails in ours.tails.items() for t in tails} == {(h, tuple(t)) for h, t in pairs if t}
        assert sorted(ours.single_set) == sorted({h for h, t in pairs if not t})
    default = breakers_of(vocabulary, ["\n", ":", '"', "*"])
    for text in ("\n", ":", '"', "*", '":', " *"):  # every token whose text holds a breaker breaks alone
        assert vocabulary.index(text) in default.single_set


def test_breakers_are_resolved_once_per_vocabulary_and_breaker() -> None:
    calls: list[str] = []

    class Counting(tuple):  # type: ignore[type-arg]  # a tuple of str that counts its scans
        def __iter__(self) -> Any:
            calls.append("scan")
            return super().__iter__()

    vocabulary = Counting(VOCAB)
    breakers_of(vocabulary, [":", "<br>"])
    first = len(calls)
    breakers_of(vocabulary, [":", "<br>"])
    breakers_of(vocabulary, ["<br>"])
    assert first > 0 and len(calls) == first


@pytest.mark.parametrize(("fields", "path", "rule"), [
    ({"penalty_last_n": MAX_DRY_LOOKBACK + 1}, "penalty_last_n", f"<= {MAX_DRY_LOOKBACK}"),
    ({"penalty_last_n": -2}, "penalty_last_n", ">= -1"),
    ({"allowed_length": 0}, "allowed_length", ">= 1"),
    ({"base": 0.9}, "base", ">= 1"),
    ({"multiplier": -1.0}, "multiplier", ">= 0"),
    ({"multiplier": float("nan")}, "multiplier", ""),
    ({"sequence_breakers": [":"] * (MAX_DRY_BREAKERS + 1)}, "sequence_breakers", f"at most {MAX_DRY_BREAKERS}"),
    ({"sequence_breakers": ["x" * (MAX_DRY_BREAKER_CHARS + 1)]}, "sequence_breakers[0]", f"at most {MAX_DRY_BREAKER_CHARS}"),
    ({"sequence_breakers": [""]}, "sequence_breakers[0]", "at least 1"),
])
def test_limits_are_refused_naming_the_field_on_both_decoders(fields: dict[str, Any], path: str, rule: str) -> None:
    entry = {"kind": "dry", "multiplier": 1.0, **fields}
    with pytest.raises(SpecError) as request_err:
        parse_entries([entry])
    assert any(p.path.endswith(f"[0].{path}") and rule in p.rule for p in request_err.value.problems), request_err.value
    with pytest.raises(SpecError) as wire_err:
        decode_wire_payload([entry])
    assert any(p.path.endswith(f"[0].{path}") for p in wire_err.value.problems), wire_err.value


def test_the_defaults_are_llama_cpps() -> None:
    spec = DrySpec.model_validate({"kind": "dry", "multiplier": 0.8})
    assert (spec.base, spec.allowed_length, spec.sequence_breakers) == (1.75, 2, ("\n", ":", '"', "*"))
    assert spec.penalty_last_n == -1 and spec.include_prompt
    assert decode_wire_payload([{"kind": "dry", "multiplier": 0.8}])[0] == decode_wire_payload([spec.model_dump()])[0]


def test_the_window_is_at_most_the_look_back() -> None:
    processor = _processor(_entry({"penalty_last_n": 5}), list(range(9)) * 3)
    window = processor._window(list(np.arange(3)))
    assert window.tolist() == [7, 8, 0, 1, 2]


def test_a_penalizing_step_allocates_nothing_vocab_sized() -> None:
    from torch.profiler import ProfilerActivity, profile

    width = 100_000
    processor = _processor(_entry({}), [A, B, C])
    history = [A, B, C, Y, A, B, C, A, B] * 20
    row = torch.zeros(width)
    processor(history, row)
    assert (row < 0).sum() > 0  # it penalizes
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        processor(history, row)
    assert max((e.cpu_memory_usage for e in prof.events()), default=0) < 4096


def test_an_engine_without_a_tokenizer_fails_a_request_naming_breakers_alone_at_realization() -> None:
    reports: list[str] = []
    failed = realize([{"kind": "dry", "multiplier": 1.0}], vocab_size=len(VOCAB), stop_token_id=1, report=reports.append,
                     facts=RequestFacts.of(prompt_ids=[], eos_token_id=1))
    assert failed is not None and failed.failed
    assert "dynamo_logits[0]: could not realize kind 'dry'" in reports[0] and "sequence_breakers: []" in reports[0]
    running = realize([{"kind": "dry", "multiplier": 1.0, "sequence_breakers": []}], vocab_size=len(VOCAB),
                      stop_token_id=1, facts=RequestFacts.of(prompt_ids=[], eos_token_id=1))
    assert running is not None and not running.failed
