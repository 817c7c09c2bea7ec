"""``Kept``: the bounded LRU behind the decode memo and the shared choice tables."""

from __future__ import annotations

from dynlogits.processors.kept import Kept


def test_kept_values_are_bounded_by_count_and_by_weight_least_recently_used_first() -> None:
    kept: Kept[tuple[str, int]] = Kept(count=3, weight=100)
    for i in range(5):
        kept.put((i,), ("value", i), 10)
    assert len(kept) == 3 and kept.get((0,)) is None and kept.get((4,)) == ("value", 4)
    kept.get((2,))  # used: the least recently used is now 3
    kept.put((5,), ("heavy", 5), 85)  # 10 + 10 + 10 + 85 > 100: the least recently used go first
    assert kept.get((3,)) is None and kept.get((4,)) is None and kept.get((2,)) is not None and kept.get((5,)) is not None
    kept.put((6,), ("too heavy", 6), 101)  # heavier than the whole budget: never kept
    assert kept.get((6,)) is None and len(kept) == 2
    fresh = kept.emptied()
    assert len(fresh) == 0 and (fresh.count, fresh.weight) == (3, 100)


def test_made_builds_a_missing_value_once_and_weighs_it() -> None:
    kept: Kept[list[int]] = Kept(count=4, weight=10)
    built: list[str] = []
    make = lambda key: (lambda: (built.append(key), [len(key)])[1])  # noqa: E731
    first = kept.made("ab", make("ab"), len)
    assert kept.made("ab", make("ab"), len) is first and built == ["ab"]
    kept.made("x" * 11, make("x" * 11), lambda value: value[0])  # weighs 11 > 10: made, not kept
    kept.made("x" * 11, make("x" * 11), lambda value: value[0])
    assert built == ["ab", "x" * 11, "x" * 11] and len(kept) == 1
