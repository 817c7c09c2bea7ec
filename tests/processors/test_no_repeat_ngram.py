"""``no_repeat_ngram`` (docs/specs.md): each token that would complete an n-gram of ``size`` tokens
already in the history is masked, exactly as transformers' ``NoRepeatNGramLogitsProcessor(size)``
masks on that history (the output, or prompt and output with ``include_prompt``); placeholders are
never taken for tokens; one instance serves several rows; sizes and scopes are checked, naming the
field."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor
from zoo_rows import V, apply, finite, logits_row, realize

from dynlogits import sdk
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.no_repeat_ngram import (
    KEPT_ROWS,
    TAIL_CHECKED,
    NoRepeatNgramGroup,
    NoRepeatNgramProcessor,
    NoRepeatNgramTemplate,
    banned_after,
    factory,
)
from dynlogits.processors.no_repeat_ngram_device import MAX_DEVICE_SIZE
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs import SpecError, decode_wire_payload
from dynlogits.specs.builtin.no_repeat_ngram import MAX_NO_REPEAT_NGRAM_SIZE, NoRepeatNgramSpec
from dynlogits.testing.oracle import OracleRequest, expected_row

NEG = float("-inf")


def masked(processor: NoRepeatNgramProcessor, history: Sequence[int]) -> list[int]:
    """The ids ``processor`` masks after ``history`` (a call, in place, on a fresh row)."""
    return sorted(set(range(V)) - set(finite(apply(processor, history))))


def transformers_masks(size: int, history: list[int]) -> list[int]:
    """What transformers' own processor masks after ``history`` (one hypothesis)."""
    scores = logits_row()[None].clone()
    out = NoRepeatNGramLogitsProcessor(size)(torch.tensor([history], dtype=torch.long), scores)
    return sorted(set(range(V)) - set(finite(out[0])))


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("include_prompt", [False, True])
def test_it_masks_what_transformers_masks_on_random_histories(size: int, include_prompt: bool) -> None:
    rng = random.Random(size * 10 + include_prompt)
    for _ in range(12):
        alphabet = rng.randint(2, 7)  # small alphabets: histories repeat n-grams often
        prompt = [rng.randrange(alphabet) + 2 for _ in range(rng.randint(0, 9))] if include_prompt else []
        output = [rng.randrange(alphabet) + 2 for _ in range(rng.randint(0, 40))]
        grown = NoRepeatNgramProcessor(size, V, prompt)  # one instance, its row's history growing (an engine's step loop)
        live: list[int] = []
        for step in range(len(output) + 1):
            want = transformers_masks(size, prompt + live)
            assert masked(grown, live) == want, (size, prompt, live)
            if step % 7 == 0 or step == len(output):  # and a fresh instance given the whole history at once
                assert masked(NoRepeatNgramProcessor(size, V, prompt), list(live)) == want
            if step < len(output):
                live.append(output[step])


def test_histories_shorter_than_size_mask_nothing_and_size_1_masks_every_seen_token() -> None:
    p = NoRepeatNgramProcessor(3, V)
    assert masked(p, []) == [] and masked(p, [5]) == [] and masked(p, [5, 5]) == []
    assert masked(p, [5, 5, 5]) == [5]
    assert masked(NoRepeatNgramProcessor(1, V), [7, 3, 7]) == [3, 7]
    assert masked(NoRepeatNgramProcessor(1, V), []) == []


def test_with_the_prompt_an_ngram_may_begin_in_the_prompt() -> None:
    p = NoRepeatNgramProcessor(3, V, prompt=[4, 5, 6, 4])
    assert masked(p, [5]) == [6]  # (4, 5) ends prompt + output; (4, 5, 6) is in the prompt
    assert masked(p, []) == []  # (6, 4) was never followed
    assert masked(NoRepeatNgramProcessor(3, V), [5]) == []  # without the prompt: nothing


def test_one_instance_serves_several_rows_interleaved() -> None:
    rng = random.Random(3)
    p = NoRepeatNgramProcessor(2, V)
    rows: list[list[int]] = [[] for _ in range(KEPT_ROWS + 3)]  # more rows than it keeps indexes for
    for _ in range(30):
        for r in rng.sample(range(len(rows)), len(rows)):
            assert masked(p, rows[r]) == transformers_masks(2, rows[r]), (r, rows[r])
            rows[r].append(rng.randrange(2, 6))


def test_a_rewritten_history_is_not_read_from_a_stale_index() -> None:
    p = NoRepeatNgramProcessor(2, V)
    assert masked(p, [3, 4, 3]) == [4]
    assert masked(p, [3, 5, 3]) == [5]  # a rejected draft: the same length, another middle token
    assert masked(p, [3]) == []  # shorter again (preempted and recomputed)
    assert masked(p, (3, 4, 3)) == [4]  # any sequence type


def test_placeholders_are_never_taken_for_tokens() -> None:
    p = NoRepeatNgramProcessor(2, V)
    live = [5, 6, 5, 6]
    assert masked(p, live) == [5]  # (6, 5) seen
    live.append(-1)  # vLLM's async placeholder in the newest slot: the next token's prefix is unknown
    assert masked(p, live) == []
    live[-1] = 5  # the engine puts the token in its place
    assert masked(p, live) == [6]
    assert masked(NoRepeatNgramProcessor(1, V), [7, -1]) == [7]  # size 1: every known token, never -1 as V - 1
    assert masked(NoRepeatNgramProcessor(2, V), [7, 8, -1, 7]) == [8]  # mid-history: the n-grams around it skipped
    assert masked(NoRepeatNgramProcessor(2, V), [7, -1, 7]) == []
    assert banned_after([7, 8, -1, 7], 2) == {8}


def test_ids_past_the_logits_width_are_not_masked() -> None:
    p = NoRepeatNgramProcessor(1, 8, prompt=[100, 3])  # a prompt id the logits do not have (e.g. multimodal)
    row = torch.zeros(8)
    p([], row)
    assert finite(row) == [0, 1, 2, 4, 5, 6, 7]


def test_the_oracle_matches_transformers_too() -> None:
    rng = random.Random(11)
    for _ in range(60):
        size = rng.randint(1, 4)
        prompt = [rng.randrange(2, 6) for _ in range(rng.randint(0, 6))]
        history = [rng.randrange(2, 6) for _ in range(rng.randint(0, 15))]
        include = rng.random() < 0.5
        row = expected_row([{"kind": "no_repeat_ngram", "size": size, "include_prompt": include}], history,
                           [0.0] * V, OracleRequest(prompt=prompt))
        want = transformers_masks(size, (prompt if include else []) + history)
        assert [i for i, x in enumerate(row) if x == NEG] == want


def test_realized_through_the_sdk_with_the_request_prompt() -> None:
    request = realize([{"kind": "no_repeat_ngram", "size": 2, "include_prompt": True}],
                      sdk.RequestFacts(prompt_ids=(9, 10)))
    row = logits_row()[None].clone()
    sdk.apply_rows(row, [0], [request], [[9]])
    assert sorted(set(range(V)) - set(finite(row[0]))) == [10]


def test_include_prompt_without_a_prompt_fails_at_realization() -> None:
    entry = NoRepeatNgramSpec(size=2, include_prompt=True)
    with pytest.raises(ValueError, match="needs the request's prompt"):
        factory(entry, RealizeContext(V))
    assert callable(factory(NoRepeatNgramSpec(size=2), RealizeContext(V)))


@pytest.mark.parametrize(("entry", "error"), [
    ({"size": 0}, "dynamo_logits[0].size: must be >= 1"),
    ({"size": MAX_NO_REPEAT_NGRAM_SIZE + 1}, f"dynamo_logits[0].size: must be <= {MAX_NO_REPEAT_NGRAM_SIZE}"),
    ({"size": 2.0}, "dynamo_logits[0].size: must be an integer"),
    ({}, "dynamo_logits[0].size: is required"),
    ({"size": 2, "include_prompt": 1}, "dynamo_logits[0].include_prompt: must be"),
    ({"size": 2, "include_prompt": True, "scope": "answer"}, "dynamo_logits[0]: include_prompt needs scope 'always'"),
])
def test_bad_entries_are_refused_naming_the_field(entry: dict, error: str) -> None:
    with pytest.raises(SpecError) as info:
        decode_wire_payload([{"kind": "no_repeat_ngram", **entry}])
    assert any(str(p).startswith(error) for p in info.value.problems), info.value.problems


def test_good_entries_decode_on_the_fast_path_as_the_model() -> None:
    for entry in ({"size": 1}, {"size": 3, "include_prompt": True}, {"size": 2, "scope": "answer"}):
        decoded = decode_wire_payload([{"kind": "no_repeat_ngram", **entry}])[0]
        assert decoded.size == entry["size"] and decoded.include_prompt == entry.get("include_prompt", False)


def test_resident_where_histories_are_on_the_host_or_in_a_token_window_hosted_where_neither() -> None:
    payload = [{"kind": "no_repeat_ngram", "size": 2}]
    assert factory(NoRepeatNgramSpec(size=2), RealizeContext(V)).template == NoRepeatNgramTemplate(2)
    histories = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)  # vLLM's V1 runner
    assert histories.assign(0, realize(payload))
    (group,) = histories.groups.values()
    assert isinstance(group, NoRepeatNgramGroup)
    assert not SlotBatch(num_slots=2, vocab_size=V, device="cpu").assign(0, realize(payload))
    window = SlotBatch(num_slots=2, vocab_size=V, device="cpu", token_window=True)  # Model Runner V2
    assert window.assign(0, realize(payload))
    assert not window.assign(1, realize([{"kind": "no_repeat_ngram", "size": MAX_DEVICE_SIZE + 1}]))  # beyond the device bound


def _payload(rng: random.Random) -> list[dict]:
    """``no_repeat_ngram`` (sizes 1-4, with or without the prompt), alone or after a resident kind."""
    entry: dict[str, Any] = {"kind": "no_repeat_ngram", "size": rng.randint(1, 4), "include_prompt": rng.random() < 0.5}
    others: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": [rng.randrange(2, 7)]}, {"kind": "logit_bias", "bias": {"3": 2.0}}]
    return [*rng.sample(others, rng.randint(0, 2)), entry]


@pytest.mark.parametrize("seed", range(4))
def test_the_resident_path_equals_the_host_path_through_batch_changes(seed: int) -> None:
    """Requests enter slots and leave, laid out in a new row order every step, with outputs drawn
    from a few ids so n-grams repeat; every step the resident rows equal their host-path twins'."""
    rng = random.Random(seed)
    slots = 5
    batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
    host: dict[int, sdk.GuardedRequest] = {}
    histories: dict[int, list[int]] = {}
    generator = torch.Generator().manual_seed(seed)
    masked_rows = 0
    for step in range(50):
        if step == 0 or rng.random() < 0.3:  # a batch change
            for slot in range(slots):
                if slot not in host or rng.random() < 0.3:
                    payload = _payload(rng)
                    facts = sdk.RequestFacts(prompt_ids=tuple(rng.randrange(2, 7) for _ in range(rng.randint(1, 5))))
                    assert batch.assign(slot, realize(payload, facts))
                    host[slot], histories[slot] = realize(payload, facts), [rng.randrange(2, 7) for _ in range(rng.randint(0, 3))]
            batch.flush()
        order = rng.sample(sorted(host), rng.randint(1, len(host)))
        padded = [*order, -1]  # a row of a request without a payload
        batch.set_rows(np.array(padded))
        logits = torch.randn(len(padded), V, generator=generator)
        resident, hosted = logits.clone(), logits.clone()
        batch.apply(resident, EngineStep(histories=[*(histories[s] for s in order), []]))
        sdk.apply_rows(hosted, list(range(len(order))), [host[s] for s in order], [histories[s] for s in order])
        assert torch.equal(resident, hosted), step
        assert torch.equal(resident[-1], logits[-1])
        masked_rows += int(torch.isneginf(hosted[:-1]).any(1).sum())
        for row, slot in enumerate(order):
            histories[slot].append(int(hosted[row].argmax()) if rng.random() < 0.3 else rng.randrange(2, 7))
    assert masked_rows >= 40  # the premise: rows met repeated n-grams at many steps


def test_a_row_whose_decision_raises_fails_its_request_alone_on_the_resident_path() -> None:
    payload = [{"kind": "no_repeat_ngram", "size": 2}]
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu", host_histories=True)
    requests = [realize(payload) for _ in range(3)]
    for slot, request in enumerate(requests):
        assert batch.assign(slot, request)
    batch.flush()
    batch.set_rows(np.array([0, 1, 2]))
    histories: list[list] = [[5, 6, 5], [5, None, 5], [4, 7, 4]]  # row 1's history breaks the index
    logits = torch.randn(3, V)
    batch.apply(logits, EngineStep(histories=histories))
    assert requests[1].failed and not requests[0].failed and not requests[2].failed
    assert sorted(set(range(V)) - set(finite(logits[0]))) == [6]
    assert sorted(set(range(V)) - set(finite(logits[2]))) == [7]


def test_a_live_list_the_engine_grows_is_read_incrementally_and_a_rewrite_of_its_tail_is_seen() -> None:
    rng = random.Random(5)
    p = NoRepeatNgramProcessor(2, V)
    live = [rng.randrange(2, 6) for _ in range(200)]  # longer than the tail compared
    assert masked(p, live) == transformers_masks(2, live)
    for _ in range(30):  # the engine appends, and sometimes rewrites the newest tokens in place (a rejected draft)
        if rng.random() < 0.3:
            live[-3:] = [rng.randrange(2, 6) for _ in range(rng.randint(1, 4))]
        else:
            live.append(rng.randrange(2, 6))
        assert masked(p, live) == transformers_masks(2, live)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("include_prompt", [False, True])
def test_a_live_list_grown_by_one_with_a_rewrite_inside_the_compared_tail_is_reindexed(size: int, include_prompt: bool) -> None:
    """The step an engine makes most (its list one token longer) is read on a fast path: a token
    rewritten in the compared tail at the same step (histories shorter and longer than
    ``TAIL_CHECKED``), a placeholder in the newest slot and ids the row keeps for a key that gains a
    follower all still mask what transformers masks."""
    rng = random.Random(size * 2 + include_prompt)
    prompt = [rng.randrange(2, 6) for _ in range(5)] if include_prompt else []
    p = NoRepeatNgramProcessor(size, V, prompt)
    live: list[int] = []
    for step in range(2 * TAIL_CHECKED + 20):
        roll = rng.random()
        if live and roll < 0.1:  # rewritten in place as the list grows by one
            live[-rng.randint(1, min(len(live), TAIL_CHECKED))] = rng.randrange(2, 6)
        if roll > 0.95:
            live.append(-1)  # a placeholder in the newest slot: masks what transformers masks before it
            got = masked(p, live)
            live[-1] = rng.randrange(2, 6)
            assert got == (transformers_masks(size, prompt + live[:-1]) if size == 1 else []), (step, live)
        else:
            live.append(rng.randrange(2, 6))
        assert masked(p, live) == transformers_masks(size, prompt + live), (step, live)
