"""``dry``'s amount tables, shared by every processor of one (multiplier, base): each entry is
``multiplier * base ** exponent`` as llama.cpp computes it, whatever order processors grew it in."""

from __future__ import annotations

import random

from dynlogits.processors.dry import _amounts_table, _grow


def test_a_shared_table_grown_in_any_order_holds_each_exponents_amount_once() -> None:
    rng = random.Random(7)
    multiplier, base = 0.8125, 1.0 + rng.random()  # a pair no other test uses
    table = _amounts_table(multiplier, base)
    for _ in range(200):
        _grow(table, rng.randrange(400), multiplier, base)
    assert len(table) >= 300  # the premise: grown far, in jumps
    assert table == [multiplier * base ** e for e in range(len(table))]


def test_processors_of_the_same_settings_read_one_table_and_others_their_own() -> None:
    assert _amounts_table(0.8, 1.75) is _amounts_table(0.8, 1.75)
    assert _amounts_table(0.8, 1.75) is not _amounts_table(0.8, 2.0)
