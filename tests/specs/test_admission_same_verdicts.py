"""Admission gives the verdicts and the work bound it gave before it became generic over the kinds'
declarations: random payloads mixing every wire kind and scope over a small vocabulary, checked by
``dynlogits.specs.consistency`` and by the frozen pre-refactor copy (``admission_reference``), must
yield the same problems (paths and text) and the same ``admission_work`` (units and drivers)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from admission_reference import admission_work as reference_work
from admission_reference import consistency as reference

from dynlogits.specs import admission_work, consistency
from dynlogits.specs.limits import DEFAULT_LIMITS, SpecLimits
from dynlogits.specs.wire import decode_entries

VOCAB = 12
SCOPES = ("always", "always", "always", "reasoning", "answer")


def _ids(rng: random.Random, low: int = 1, high: int = 4) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]


def _entry(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(("forced_sequence", "banned_tokens", "allowed_tokens", "logit_bias", "min_tokens",
                       "thinking_budget", "reasoning", "banned_phrases", "multiple_choice", "multiple_choice",
                       "trigger", "trigger", "deadline", "prompt_tokens", "python"))
    item: dict[str, Any] = {"kind": kind}
    if kind == "forced_sequence":
        item.update(token_ids=_ids(rng, 1, 6), eos_token_id=rng.randrange(VOCAB))
    elif kind == "banned_tokens":
        item.update(token_ids=_ids(rng, 1, VOCAB))
    elif kind == "allowed_tokens":
        item.update(token_ids=_ids(rng, 1, 6))
        if rng.random() < 0.5:
            item.update(eos_token_id=rng.randrange(VOCAB))
    elif kind == "logit_bias":
        item.update(bias={str(rng.randrange(VOCAB)): rng.uniform(-5, 5)})
    elif kind == "min_tokens":
        item.update(min_tokens=rng.randint(1, 6), stop_token_ids=_ids(rng, 1, 3))
    elif kind == "thinking_budget":
        item.update(budget=rng.randint(0, 5))
        if rng.random() < 0.6:
            item.update(start_token_ids=_ids(rng, 1, 2), end_token_ids=_ids(rng, 1, 3))
    elif kind == "reasoning":
        item.update(start_token_ids=_ids(rng, 1, 2), end_token_ids=_ids(rng, 1, 2))
    elif kind == "banned_phrases":
        item.update(phrases=[_ids(rng, 1, 3) for _ in range(rng.randint(1, 3))])
    elif kind == "multiple_choice":
        item.update(choices=[_ids(rng, 1, 4) for _ in range(rng.randint(1, 4))])
        if rng.random() < 0.5:
            item.update(eos_token_id=rng.randrange(VOCAB))
    elif kind == "trigger":
        item.update(trigger_token_ids=_ids(rng, 1, 2), phrase_token_ids=_ids(rng, 1, 3))
    elif kind == "deadline":
        item.update(seconds=rng.uniform(0.1, 5))
    elif kind == "prompt_tokens":
        item.update(mode=rng.choice(("boost", "restrict")))
    else:
        item.update(factory="pkg.mod:make")
    if kind not in ("reasoning",) and rng.random() < 0.35:
        item["scope"] = rng.choice(SCOPES)
    return item


def _payloads(seed: int, count: int) -> list[list[Any]]:
    rng = random.Random(seed)
    made: list[list[Any]] = []
    while len(made) < count:
        payload = [_entry(rng) for _ in range(rng.choice((1, 2, 2, 3, 3, 4, 5)))]
        if sum(item["kind"] == "reasoning" for item in payload) <= 1:
            made.append(list(decode_entries(payload)))
    return made


def _work(work: Any) -> tuple[int, tuple[tuple[int, str, int, str], ...]]:
    return work.units, tuple((d.index, d.field, d.units, d.what) for d in work.drivers)


@pytest.mark.parametrize("seed", [48, 4801, 4802])
def test_same_verdicts_and_work_as_the_reference(seed: int) -> None:
    tight = SpecLimits(max_admission_work=500)  # over it, the budget's problem names the drivers
    for entries in _payloads(seed, 1500):
        for vocab in (None, VOCAB):
            for limits in (DEFAULT_LIMITS, tight):
                consistency.VERDICTS.clear()  # a kept verdict skips the budget
                reference.VERDICTS.clear()
                got = consistency.consistency_problems(entries, root="p", vocab_size=vocab, limits=limits)
                want = reference.consistency_problems(entries, root="p", vocab_size=vocab, limits=limits)
                assert [(p.path, p.rule) for p in got] == [(p.path, p.rule) for p in want], entries
            assert _work(admission_work.admission_work(entries, vocab)) == _work(reference_work.admission_work(entries, vocab)), entries
            assert admission_work.walks_needed(entries, vocab) == reference_work.walks_needed(entries, vocab)
