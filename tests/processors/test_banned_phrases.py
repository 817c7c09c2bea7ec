"""``banned_phrases`` (docs/specs.md): a phrase's last token is masked at every step where the output
ends with the rest of it, a one-token phrase at every step. Host path; the resident path where the
adapter gives the histories (vLLM V1), through batch changes beside other kinds; where it gives
none (Model Runner V2) a request with longer phrases stays hosted, one with one-token phrases only
is a ``banned_tokens``."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from zoo_rows import EOS, V, apply, finite, largest_allocation, logits_row, realize

from dynlogits import sdk
from dynlogits.processors import banned_phrases
from dynlogits.processors.banned_phrases import BannedPhrasesProcessor, BannedPhrasesTemplate
from dynlogits.processors.banned_tokens import BannedTokensTemplate
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs import SpecError, decode_wire_payload

PHRASES = [(9,), (5, 6), (5, 7), (4, 5, 6, 8), (3, 3)]


def masked(processor: BannedPhrasesProcessor, history: list[int]) -> list[int]:
    """The ids ``processor`` masks after ``history``."""
    return sorted(set(range(V)) - set(finite(apply(processor, history))))


def test_the_last_token_is_masked_only_where_the_output_ends_with_the_rest() -> None:
    p = BannedPhrasesProcessor(PHRASES)
    assert masked(p, []) == [9]  # a one-token phrase: every step
    assert masked(p, [1, 5]) == [6, 7, 9]  # two phrases share their first token
    assert masked(p, [5, 2]) == [9]
    assert masked(p, [4, 5, 6]) == [8, 9]  # (4, 5, 6) ends it; (5, 6) itself is no prefix
    assert masked(p, [4, 5]) == [6, 7, 9]
    assert masked(p, [3]) == [3, 9] and masked(p, [3, 3]) == [3, 9]  # overlapping itself


@pytest.mark.parametrize("seed", range(4))
def test_the_masked_ids_agree_with_the_kit_oracle_over_random_phrases_and_histories(seed: int) -> None:
    from dynlogits.testing.oracle import _banned_phrases

    rng = random.Random(seed)
    for _ in range(40):  # small alphabets, so prefixes share tails and histories meet them
        phrases = [[rng.randrange(2, 8) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 12))]
        p = BannedPhrasesProcessor(phrases)
        for _ in range(10):
            history = [rng.randrange(2, 8) for _ in range(rng.randint(0, 9))]
            want = [0.0] * V
            _banned_phrases(want, {"phrases": phrases}, history)
            assert masked(p, history) == [i for i, x in enumerate(want) if x == float("-inf")], (phrases, history)


def test_only_the_output_counts_not_the_prompt() -> None:
    request = realize([{"kind": "banned_phrases", "phrases": [[5, 6]]}], sdk.RequestFacts(prompt_ids=(1, 5)))
    row = logits_row()[None].clone()
    sdk.apply_rows(row, [0], [request], [[]])
    assert torch.equal(row[0], logits_row())


def test_a_step_allocates_nothing_vocab_sized() -> None:
    p = BannedPhrasesProcessor(PHRASES)
    row = torch.zeros(100_000)
    p([4, 5], row)
    assert largest_allocation(lambda: p([4, 5], row)) < 4096


def test_a_repeated_phrase_set_shares_its_tables_and_the_kept_sets_stay_bounded(monkeypatch) -> None:
    from dynlogits.processors import banned_phrases
    from dynlogits.processors.kept import Kept

    monkeypatch.setattr(banned_phrases, "_TABLES", Kept(2, banned_phrases.TABLES_BYTES))
    first, again = BannedPhrasesProcessor(PHRASES), BannedPhrasesProcessor([list(p) for p in PHRASES])
    assert again._tails is first._tails and again.template is first.template  # same content: built once
    assert again._sets is not first._sets  # what a processor caches per step stays its own
    assert masked(again, [4, 5]) == masked(first, [4, 5]) == [6, 7, 9]
    other = [(1, 2), (3,)]
    assert BannedPhrasesProcessor(other)._tails is not first._tails
    BannedPhrasesProcessor([(2, 2)] * (2 * len(PHRASES)))  # a third set: past the bound, the oldest goes
    assert BannedPhrasesProcessor(PHRASES)._tails is not first._tails
    assert masked(BannedPhrasesProcessor(PHRASES), [4, 5]) == [6, 7, 9]


def test_one_token_phrases_only_are_a_banned_tokens_resident_everywhere_longer_ones_where_tokens_are_read() -> None:
    only = BannedPhrasesProcessor([(9,), (4,)])
    assert only.template == BannedTokensTemplate((4, 9))
    assert isinstance(BannedPhrasesProcessor(PHRASES).template, BannedPhrasesTemplate)
    no_histories = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    assert no_histories.assign(0, realize([{"kind": "banned_phrases", "phrases": [[9], [4]]}]))
    assert not no_histories.assign(1, realize([{"kind": "banned_phrases", "phrases": [[9], [5, 6]]}]))
    device_tokens = SlotBatch(num_slots=2, vocab_size=V, device="cpu", token_window=True)  # Model Runner V2
    assert device_tokens.assign(1, realize([{"kind": "banned_phrases", "phrases": [[9], [5, 6]]}]))
    group, = device_tokens.groups.values()
    assert (group.entries, group.width) == (2, 1)  # its entry tables, read from the token window
    histories = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True, token_window=True)
    assert histories.assign(1, realize([{"kind": "banned_phrases", "phrases": [[9], [5, 6]]}]))
    group, = histories.groups.values()
    assert group.entries == 0  # decided on the host: no entry tables written


def _random_payload(rng: random.Random) -> list[dict]:
    """``banned_phrases`` (1-4 tokens, from a few ids so outputs meet them) beside other kinds."""
    ids = list(range(2, 7))
    phrases = [[rng.choice(ids) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 6))]
    others = [{"kind": "banned_tokens", "token_ids": [rng.choice(ids)]},
              {"kind": "logit_bias", "bias": {str(rng.choice(ids)): 2.0}},
              {"kind": "allowed_tokens", "token_ids": ids, "eos_token_id": EOS},
              {"kind": "forced_sequence", "token_ids": [rng.choice(ids) for _ in range(3)], "eos_token_id": EOS}]
    while True:
        payload = [{"kind": "banned_phrases", "phrases": phrases}, *rng.sample(others, rng.randint(0, 2))]
        rng.shuffle(payload)
        try:
            decode_wire_payload(payload, vocab_size=V)
            return payload
        except SpecError:  # a forced sequence that writes a phrase, or a ban that empties the allowed set
            phrases = [[rng.choice(ids) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 6))]


@pytest.mark.parametrize("seed", range(6))
def test_the_resident_path_equals_the_host_path_through_batch_changes(seed: int) -> None:
    """Requests arrive in slots, leave, and are laid out in a new row order every step; the rows'
    outputs are drawn from the phrases' ids so their prefixes are met. Every step the resident rows
    equal their host-path twins'."""
    rng = random.Random(seed)
    slots = 6
    batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
    host: dict[int, sdk.GuardedRequest] = {}
    histories: dict[int, list[int]] = {}
    phrases: dict[int, list[list[int]]] = {}
    generator = torch.Generator().manual_seed(seed)
    met = 0
    for step in range(60):
        if step == 0 or rng.random() < 0.3:  # a batch change
            for slot in range(slots):
                if slot not in host or rng.random() < 0.3:
                    payload = _random_payload(rng)
                    assert batch.assign(slot, realize(payload))
                    host[slot], histories[slot] = realize(payload), [rng.randrange(2, 7) for _ in range(rng.randint(0, 3))]
                    phrases[slot] = next(e for e in payload if e["kind"] == "banned_phrases")["phrases"]
            batch.flush()
        order = rng.sample(sorted(host), rng.randint(1, len(host)))
        padded = [*order, -1]  # a row of a request without a payload
        batch.set_rows(np.array(padded))
        logits = torch.randn(len(padded), V, generator=generator)
        resident, hosted = logits.clone(), logits.clone()
        batch.apply(resident, EngineStep(histories=[*(histories[s] for s in order), []]))
        sdk.apply_rows(hosted, list(range(len(order))), [host[s] for s in order], [histories[s] for s in order])
        assert torch.equal(resident, hosted), step
        for row, slot in enumerate(order):
            h = histories[slot]
            met += any(len(p) > 1 and len(h) >= len(p) - 1 and h[len(h) - len(p) + 1:] == p[:-1] for p in phrases[slot])
            histories[slot].append(int(hosted[row].argmax()) if rng.random() < 0.5 else rng.randrange(2, 7))
    assert met >= 15  # the premise: outputs ended with phrase prefixes at many steps


def test_a_row_whose_walk_raises_fails_its_request_alone_on_the_host_decided_path() -> None:
    """With host histories every row is walked in one pass (``decide_rows``); a row whose history
    breaks the walk (an unhashable token) fails its request and is fail-stopped; the rows before
    and after it are masked as on the host path."""
    payload = [{"kind": "banned_phrases", "phrases": [[5, 6], [9]]}]
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu", host_histories=True)
    requests = [realize(payload) for _ in range(3)]
    for slot, request in enumerate(requests):
        assert batch.assign(slot, request)
    batch.flush()
    batch.set_rows(np.array([0, 1, 2]))
    histories: list[list] = [[5], [5, [5]], [4, 5]]
    logits = torch.randn(3, V)
    batch.apply(logits, EngineStep(histories=histories))
    assert requests[1].failed and not requests[0].failed and not requests[2].failed
    assert finite(logits[1]) == [EOS]
    for row in (0, 2):
        hosted = logits_row()[None].clone()
        sdk.apply_rows(hosted, [0], [realize(payload)], [histories[row]])
        assert finite(logits[row]) == finite(hosted[0])
        assert 6 not in finite(logits[row]) and 9 not in finite(logits[row])


def _ends_with(history: list, prefix: list[int]) -> bool:
    return 0 < len(prefix) <= len(history) and history[len(history) - len(prefix):] == prefix


@pytest.mark.parametrize("seed", range(4))
def test_the_pass_over_many_rows_masks_what_each_row_ends_with(seed: int) -> None:
    """``masked_after`` over a layout's rows (the V1 runner's pass: last tokens looked up by C maps,
    then the hits walked) finds per row, at its offset, exactly the last tokens of the phrases whose
    other tokens end its history (brute force), with rows in any order; an empty history sends the
    step row by row, with the same result, and a row whose history breaks the walk (an unhashable
    token) is passed to ``fail`` alone, on either route."""
    rng = random.Random(seed)
    for case in range(30):
        n = rng.randint(1, 12)
        phrase_sets = [[[rng.randrange(2, 8) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 10))]
                       for _ in range(n)]
        processors = [BannedPhrasesProcessor(p) for p in phrase_sets]
        histories: list[list] = [[rng.randrange(2, 8) for _ in range(rng.randint(1, 9))] for _ in range(n + 2)]
        if case % 3 == 1:
            histories[rng.randrange(n + 2)] = []  # row by row
        broken = rng.randrange(n) if case % 4 == 2 else -1
        rows = rng.sample(range(n + 2), n)
        if broken >= 0:
            histories[rows[broken]] = [*histories[rows[broken]], [5]]  # unhashable last token
        offsets = [1000 * (k + 1) for k in range(n)]
        slots = [50 + k for k in range(n)]
        found: list[int] = []
        failed: list[tuple[int, int]] = []
        banned_phrases.masked_after((offsets, rows, slots, [p.tails for p in processors]), histories, found,
                                    lambda row, slot, exc, failed=failed: failed.append((row, slot)))
        want = sorted(offsets[k] + p[-1] for k in range(n) if k != broken for p in phrase_sets[k]
                      if len(p) > 1 and _ends_with(histories[rows[k]], p[:-1]))
        assert sorted(set(found)) == sorted(set(want)), (case, phrase_sets, histories)
        assert failed == ([(rows[broken], slots[broken])] if broken >= 0 else [])


def test_a_row_that_breaks_the_walk_past_its_last_token_fails_alone_in_the_pass() -> None:
    """A row whose last token hits and whose earlier token is unhashable, where several tokens may
    come before the last (a dict to look up), fails alone (``fail`` with its row and slot); the rows
    beside it are walked as usual."""
    tails = BannedPhrasesProcessor([[4, 5, 6], [3, 5, 9], [7, 8]]).tails
    histories: list[list] = [[4, 5], [[4], 5], [1, 7]]
    found: list[int] = []
    failed: list[tuple[int, int]] = []
    banned_phrases.masked_after(([0, 100, 200], [2, 1, 0], [7, 8, 9], [tails] * 3), histories, found,
                                lambda row, slot, exc: failed.append((row, slot)))
    assert failed == [(1, 8)] and sorted(found) == [8, 206]


@pytest.mark.parametrize("token_window", [False, True], ids=["host-histories", "token-window"])
def test_a_released_slot_keeps_none_of_its_one_token_phrases_in_the_group(token_window: bool) -> None:
    """A request leaving its slot (or the slot cleared for a request of another kind) takes its
    one-token phrases out of the group: nothing of it stays held until the slot is reused."""
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu", host_histories=not token_window, token_window=True)
    for slot in range(3):
        assert batch.assign(slot, realize([{"kind": "banned_phrases", "phrases": [[9], [4], [5, 6]]}]))
    group, = batch.groups.values()
    batch.assign(1, None)
    assert batch.assign(2, realize([{"kind": "banned_tokens", "token_ids": [3]}]))  # another kind's group
    assert sorted(group._always) == [0]  # type: ignore[attr-defined]  # the group's per-slot one-token phrases
    batch.flush()
    batch.set_rows(np.array([0, 1, 2]))
    if not token_window:  # the remaining member still masks its phrases
        logits = torch.zeros(3, V)
        batch.apply(logits, EngineStep(histories=[[5], [], []]))
        assert sorted(set(range(V)) - set(finite(logits[0]))) == [4, 6, 9]
