"""``dry``'s common step (``DryProcessor._step_into``: the live list last read, one token longer, no
breaker in the window) against the general path on the same history: ids past the logits' width
are never penalized there either, and processors of other settings sharing a process keep their own
(``_hot_settings``)."""

from __future__ import annotations

import random

import pytest

from dynlogits.processors.dry import TAIL_CHECKED, WHOLE_COMPARED, Breakers, DryProcessor


def _processor(allowed: int = 2) -> DryProcessor:
    return DryProcessor(multiplier=0.8, base=1.75, allowed_length=allowed, lookback=64, breakers=Breakers.none())


@pytest.mark.parametrize("width", [8, 9, 10, 16])
def test_the_common_step_penalizes_only_ids_inside_the_width(width: int) -> None:
    live = [9, 7, 9, 7, 9]
    stepped = _processor()
    stepped.step_penalties(live, width)
    live.append(7)  # the same list, one token longer: the common step (9 follows each earlier 7)
    got = stepped.step_penalties(live, width)
    assert got == _processor().step_penalties(list(live), width)  # a fresh state: the general path
    assert got[0] == ([9] if width > 9 else [])


def test_processors_of_other_allowed_lengths_keep_their_own_settings() -> None:
    live_a, live_b = [9, 7, 9, 7, 9], [9, 7, 9, 7, 9]
    short, long = _processor(allowed=2), _processor(allowed=3)
    short.step_penalties(live_a, 16)
    long.step_penalties(live_b, 16)
    live_a.append(7)
    live_b.append(7)
    short_ids, short_pens = short.step_penalties(live_a, 16)
    long_ids, long_pens = long.step_penalties(live_b, 16)
    assert short_ids == long_ids == [9]  # the repeat "9 7 9 7" ends at length 3 or 4 before the last 7
    assert short_pens != long_pens
    assert (short_ids, short_pens) == _processor(allowed=2).step_penalties(list(live_a), 16)
    assert (long_ids, long_pens) == _processor(allowed=3).step_penalties(list(live_b), 16)


@pytest.mark.parametrize("length", [40, WHOLE_COMPARED + 40])  # compared whole / on the last TAIL_CHECKED
@pytest.mark.parametrize("prompt", [(), (5, 9, 7)])
def test_the_common_step_sees_a_rewrite_of_the_checked_tokens_of_a_live_list(length: int, prompt: tuple[int, ...]) -> None:
    rng = random.Random(length)
    live = [rng.randrange(6) for _ in range(4)]
    stepped = DryProcessor(multiplier=0.8, base=1.75, allowed_length=2, lookback=64, breakers=Breakers.none(),
                           prompt=prompt)
    while len(live) < length:  # the same list, one token longer each step: the common step
        live.append(rng.randrange(6))
        got = stepped.step_penalties(live, 16)
        assert got == _processor_with(prompt).step_penalties(list(live), 16)
    for back in (2, TAIL_CHECKED - 1):  # a token inside the checked tail rewritten, then one more token
        live[-back] = (live[-back] + 1) % 6
        live.append(rng.randrange(6))
        assert stepped.step_penalties(live, 16) == _processor_with(prompt).step_penalties(list(live), 16)


def _processor_with(prompt: tuple[int, ...]) -> DryProcessor:
    return DryProcessor(multiplier=0.8, base=1.75, allowed_length=2, lookback=64, breakers=Breakers.none(),
                        prompt=prompt)
