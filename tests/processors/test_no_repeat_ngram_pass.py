"""``no_repeat_ngram`` on vLLM's V1 runner, where the group steps every row at once while each live
history is one token longer (``_Pass``): every row masks what transformers masks on its history,
whatever the engine does to its lists between steps (grows them by one, rewrites a token inside or
beyond the compared tail, leaves a placeholder, skips a step, hands a new list, reorders the
batch), for short histories and ones past ``WHOLE_COMPARED``; a row whose history breaks fails
alone; the rows' indexes stay right for their processors when a pass stops. Every test runs with
the pass's reads compiled (``no_repeat_ngram_pass_native``; needs a C compiler) and in Python."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from zoo_rows import V, realize

from dynlogits import sdk
from dynlogits.processors import no_repeat_ngram_pass_native as pass_native
from dynlogits.processors.no_repeat_ngram import TAIL_CHECKED, WHOLE_COMPARED, NoRepeatNgramGroup, banned_after
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch


@pytest.fixture(autouse=True, params=["compiled", "python"])
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The pass's reads compiled (counted here; they must build and pass their probe where ``cc``
    is) or in Python (none counted)."""
    calls: Counter[str] = Counter()
    if request.param == "python":
        monkeypatch.setattr(pass_native, "functions", lambda wait=False: None)
        return calls
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine")
    built = pass_native.functions(wait=True)
    assert built is not None, "the compiled pass did not load here"
    read, gather = built

    def counted_read(*args: Any) -> int:
        got = int(read(*args))
        calls["held"] += got == -1
        return got

    def counted_gather(*args: Any) -> int:
        calls["gather"] += 1
        return int(gather(*args))

    monkeypatch.setattr(pass_native, "functions", lambda wait=False: (counted_read, counted_gather))
    return calls


def _masked(row: torch.Tensor) -> list[int]:
    return torch.isneginf(row).nonzero().flatten().tolist()


def _want(size: int, prompt: list[int], history: list[int]) -> list[int]:
    return sorted(t for t in banned_after(prompt + history, size) if t < V)


class _Engine:
    """A V1-style engine: slots with live output lists, a layout (row order) per batch change."""

    def __init__(self, rng: random.Random, slots: int, long: bool) -> None:
        self.rng = rng
        self.batch = SlotBatch(num_slots=slots, vocab_size=V, device="cpu", host_histories=True)
        self.entries: dict[int, tuple[int, list[int], list[int], sdk.GuardedRequest]] = {}  # slot -> size, prompt, live list
        self.long = long
        self.order: list[int] = []
        self.histories: list[Any] = []

    def add(self, slot: int) -> None:
        rng = self.rng
        size, include = rng.randint(1, 4), rng.random() < 0.5
        prompt = [rng.randrange(2, 6) for _ in range(rng.randint(1, 6))]
        request = realize([{"kind": "no_repeat_ngram", "size": size, "include_prompt": include}],
                          sdk.RequestFacts(prompt_ids=tuple(prompt)))
        assert self.batch.assign(slot, request)
        start = rng.randint(WHOLE_COMPARED, WHOLE_COMPARED + 40) if self.long else rng.randint(0, 6)
        self.entries[slot] = (size, prompt if include else [], [rng.randrange(2, 6) for _ in range(start)], request)

    def relayout(self) -> None:
        self.batch.flush()
        self.order = self.rng.sample(sorted(self.entries), len(self.entries))
        self.batch.set_rows(np.array(self.order))
        self.histories = [self.entries[s][2] for s in self.order]

    def step(self) -> tuple[torch.Tensor, list[int]]:
        logits = torch.zeros(len(self.order), V)
        self.batch.apply(logits, EngineStep(histories=self.histories))
        return logits, self.order


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_every_row_masks_what_transformers_masks_whatever_the_engine_does_to_its_lists(seed: int, long: bool,
                                                                                        reads: Counter[str]) -> None:
    rng = random.Random(seed * 2 + long)
    engine = _Engine(rng, slots=6, long=long)
    for slot in range(6):
        engine.add(slot)
    engine.relayout()
    passes = events = 0
    for step in range(120):
        logits, order = engine.step()
        (group,) = engine.batch.groups.values()
        assert isinstance(group, NoRepeatNgramGroup)
        passes += group._cache.get("pass") is not None
        for row, slot in enumerate(order):
            size, prompt, live, _ = engine.entries[slot]
            want = _want(size, prompt, live) if not live or live[-1] >= 0 or size == 1 else []
            if live and live[-1] < 0 and size == 1:
                want = _want(1, prompt, live[:-1])
            assert _masked(logits[row]) == want, (step, slot, size, prompt, live[-12:])
        roll = rng.random()
        if roll < 0.03:  # a batch change: a request leaves, another comes, the rows reorder
            slot = rng.choice(sorted(engine.entries))
            engine.batch.assign(slot, None)
            engine.add(slot)
            engine.relayout()
        elif roll < 0.06:
            engine.relayout()
        for slot in engine.order:
            live = engine.entries[slot][2]
            if live and live[-1] < 0:  # the engine puts the token in the placeholder's place
                live[-1] = rng.randrange(2, 6)
                events += 1
                continue
            r = rng.random()
            if r < 0.04 and live:  # a token rewritten inside the compared tail as the list grows
                live[-rng.randint(1, min(len(live), TAIL_CHECKED))] = rng.randrange(2, 6)
                events += 1
            elif r < 0.06:  # a placeholder in the newest slot (async scheduling)
                live.append(-1)
                events += 1
                continue
            elif r < 0.08:  # a step without this row (two tokens at once)
                live.append(rng.randrange(2, 6))
                events += 1
            elif r < 0.09:  # a new list of the same tokens
                size, prompt, _, request = engine.entries[slot]
                live = list(live)
                engine.entries[slot] = (size, prompt, live, request)
                engine.histories[engine.order.index(slot)] = live
                events += 1
            live.append(rng.randrange(2, 6))
    assert passes > 60 and events > 20  # the premise: most steps were stepped at once, and the lists changed often
    assert not reads or reads["held"] > 40  # compiled: many steps were read in C


def test_a_rewrite_deeper_than_the_tail_of_a_short_list_is_seen() -> None:
    """While the lists are shorter than ``WHOLE_COMPARED`` they are compared whole: a rewrite deeper
    than ``TAIL_CHECKED`` tokens is seen too (the processor's own step compares as much)."""
    engine = _Engine(random.Random(1), slots=1, long=False)
    request = realize([{"kind": "no_repeat_ngram", "size": 2}])
    assert engine.batch.assign(0, request)
    live = [2, 3] + [4, 5] * 60 + [2]  # (2, 3) once, far back
    engine.entries[0] = (2, [], live, request)
    engine.relayout()
    for _ in range(3):
        live.append(5)
        engine.step()
    live.append(2)
    assert _masked(engine.step()[0][0]) == _want(2, [], live) == [3, 5]
    live[1] = 4  # 120 tokens back, past TAIL_CHECKED: (2, 3) is gone
    live.append(2)
    assert len(live) < WHOLE_COMPARED and _masked(engine.step()[0][0]) == _want(2, [], live) == [2, 4, 5]


def test_the_rows_indexes_stay_right_for_their_processors_when_a_pass_stops() -> None:
    rng = random.Random(7)
    engine = _Engine(rng, slots=4, long=False)
    for slot in range(4):
        engine.add(slot)
    engine.relayout()
    for _ in range(30):
        engine.step()
        for slot in engine.order:
            engine.entries[slot][2].append(rng.randrange(2, 5))
    (group,) = engine.batch.groups.values()
    assert group._cache.get("pass") is not None
    for size, prompt, live, request in engine.entries.values():
        processor = request.processor.processors[0]
        assert sorted(processor.banned(live)) == _want(size, prompt, live)  # its node was dropped by the pass
        live.append(rng.randrange(2, 5))
        assert sorted(processor.banned(live)) == _want(size, prompt, live)


def test_a_row_whose_history_breaks_fails_alone_and_the_others_step_on() -> None:
    engine = _Engine(random.Random(3), slots=3, long=False)
    requests = []
    for slot in range(3):
        request = realize([{"kind": "no_repeat_ngram", "size": 2}])
        assert engine.batch.assign(slot, request)
        engine.entries[slot] = (2, [], [5, 6, 5], request)
        requests.append(request)
    engine.relayout()
    for _ in range(3):  # a pass running
        engine.step()
        for slot in engine.order:
            engine.entries[slot][2].append(5)
    engine.entries[1][2].append(None)  # type: ignore[arg-type]  # row 1's history breaks its index
    for slot in (0, 2):
        engine.entries[slot][2].append(6)
    logits, order = engine.step()
    assert requests[1].failed and not requests[0].failed and not requests[2].failed
    for row, slot in enumerate(order):
        if slot != 1:
            assert _masked(logits[row]) == _want(2, [], engine.entries[slot][2])


def test_ids_past_the_logits_width_are_not_masked_by_a_pass() -> None:
    engine = _Engine(random.Random(4), slots=1, long=False)
    request = realize([{"kind": "no_repeat_ngram", "size": 1, "include_prompt": True}], sdk.RequestFacts(prompt_ids=(V + 5, 3)))
    assert engine.batch.assign(0, request)
    live = [4]
    engine.entries[0] = (1, [V + 5, 3], live, request)
    engine.relayout()
    for token in (V + 7, 2, 4):  # an id the logits do not have, in the output too
        assert _masked(engine.step()[0][0]) == _want(1, [V + 5, 3], live)
        live.append(token)
    assert _masked(engine.step()[0][0]) == [2, 3, 4]
