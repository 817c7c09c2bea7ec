"""``Kept``: the bounded LRU behind the decode memo and the shared choice and phrase tables, and
``deep_size``, what it weighs values with, checked against what ``tracemalloc`` measures."""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dynlogits.processors import banned_phrases, multiple_choice
from dynlogits.processors.kept import Kept, deep_size
from dynlogits.specs import DEFAULT_LIMITS
from dynlogits.specs.wire import decode_entries


def test_kept_values_are_bounded_by_count_and_by_bytes_least_recently_used_first() -> None:
    kept: Kept[tuple[str, int]] = Kept(count=3, size=100)
    for i in range(5):
        kept.put((i,), ("value", i), 10)
    assert len(kept) == 3 and kept.get((0,)) is None and kept.get((4,)) == ("value", 4) and kept.held == 30
    kept.get((2,))  # used: the least recently used is now 3
    kept.put((5,), ("heavy", 5), 85)  # 10 + 10 + 10 + 85 > 100: the least recently used go first
    assert kept.get((3,)) is None and kept.get((4,)) is None and kept.get((2,)) is not None and kept.get((5,)) is not None
    kept.put((6,), ("too heavy", 6), 101)  # heavier than the whole budget: never kept
    assert kept.get((6,)) is None and len(kept) == 2 and kept.held == 95
    fresh = kept.emptied()
    assert len(fresh) == 0 and (fresh.count, fresh.size) == (3, 100)


def test_made_builds_a_missing_value_once_and_weighs_it_with_its_key_unless_told() -> None:
    kept: Kept[list[int]] = Kept(count=4, size=10)
    built: list[str] = []
    make = lambda key: (lambda: (built.append(key), [len(key)])[1])  # noqa: E731
    first = kept.made("ab", make("ab"), len)
    assert kept.made("ab", make("ab"), len) is first and built == ["ab"]
    kept.made("x" * 11, make("x" * 11), lambda value: value[0])  # weighs 11 > 10: made, not kept
    kept.made("x" * 11, make("x" * 11), lambda value: value[0])
    assert built == ["ab", "x" * 11, "x" * 11] and len(kept) == 1
    weighed: Kept[list[int]] = Kept(count=4, size=1 << 20)
    weighed.made("key", lambda: list(range(1000, 2000)))
    assert weighed.held == deep_size(("key", list(range(1000, 2000)))) > 1000 * 32


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """``tracemalloc`` on: yields what the heap holds now beyond what it held on entry."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        yield lambda: (gc.collect(), tracemalloc.get_traced_memory()[0] - start)[1]
    finally:
        tracemalloc.stop()


def _ids(rng: random.Random, n: int, high: int = 50_000) -> list[int]:
    return [rng.randrange(1, high) for _ in range(n)]


def _choice_tables(seed: int, choices: int = 255, length: int = 64) -> tuple[Any, Any]:
    """A choice set fresh from JSON (as a payload brings it: every id its own object), with its tables."""
    rng = random.Random(seed)
    made = msgspec.json.decode(msgspec.json.encode([_ids(rng, length) for _ in range(choices)]))
    key = (tuple(map(tuple, made)), 0)
    processor = multiple_choice.MultipleChoiceProcessor.__new__(multiple_choice.MultipleChoiceProcessor)
    processor._eos = 0
    return key, processor._build(key[0])


def _phrase_tables(seed: int, phrases: int = 256, length: int = 64) -> tuple[Any, Any]:
    rng = random.Random(seed)
    key = tuple(map(tuple, msgspec.json.decode(msgspec.json.encode([_ids(rng, length) for _ in range(phrases)]))))
    return key, banned_phrases._build(key)


def _entries(seed: int) -> Any:
    rng = random.Random(seed)
    payload = [{"kind": "banned_tokens", "token_ids": _ids(rng, 4000)},
               {"kind": "banned_phrases", "phrases": [_ids(rng, 64) for _ in range(256)]},
               {"kind": "multiple_choice", "choices": [_ids(rng, 64) for _ in range(255)]}]
    content = msgspec.json.encode(payload)
    return content, decode_entries(msgspec.json.decode(content), limits=DEFAULT_LIMITS)


#: What each memo keeps, as it keeps it, and how it weighs it.
WEIGHED: dict[str, tuple[Callable[[], Any], Callable[[Any], int]]] = {
    "multiple_choice tables, 255 choices of 64": (lambda: _choice_tables(1), lambda kt: multiple_choice._weight(*kt)),
    "multiple_choice tables, 3 short choices": (lambda: _choice_tables(2, 3, 2), lambda kt: multiple_choice._weight(*kt)),
    "banned_phrases tables, 256 phrases of 64": (lambda: _phrase_tables(3), lambda kt: banned_phrases._weight(*kt)),
    "banned_phrases tables, 4 one-token phrases": (lambda: _phrase_tables(4, 4, 1), lambda kt: banned_phrases._weight(*kt)),
    "decoded entries with their JSON": (lambda: _entries(5), deep_size),
}


def _measured() -> dict[str, Any]:
    """Each ``WEIGHED`` value's heap (the least of three builds: a first build may fill a cache the
    others find filled) and its weight, with the number of threads the process runs."""
    out: dict[str, Any] = {"threads": threading.active_count()}
    for name, (make, weigh) in WEIGHED.items():
        reals = []
        for _ in range(3):
            with traced() as held:
                value = make()
                reals.append(held())
        out[name] = (min(reals), weigh(value))
    return out


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    """``_measured`` in a fresh process. Threads that earlier tests leave in this one (engines,
    failure watchers) allocate during any window, a few KiB seen, which no build of a value holds."""
    code = "import json, runpy, sys; print(json.dumps(runpy.run_path(sys.argv[1])['_measured']()))"
    done = subprocess.run([sys.executable, "-c", code, __file__], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("name", list(WEIGHED))
def test_what_a_memo_weighs_is_what_its_values_take_on_the_heap(name: str, measured: dict[str, Any]) -> None:
    """The weight is never below what ``tracemalloc`` sees the value (built from JSON, every input
    dropped but what it keeps) hold, give or take the 2.5 KiB ``tracemalloc`` sees
    around any call, and at most 25% (or 2 KiB) above it. Measured in a process whose only thread
    builds the value."""
    real, weight = measured[name]
    assert measured["threads"] == 1
    assert real - 2560 <= weight <= max(real * 1.25, real + 2048), (name, real, weight)


@pytest.mark.parametrize("kind", ["multiple_choice", "banned_phrases"])
def test_a_table_memo_given_a_byte_budget_never_keeps_more_than_it(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct large choice or phrase sets, realized one after the other: the heap never holds
    more than the memo's byte budget once their processors are gone, and the memo keeps some."""
    module = multiple_choice if kind == "multiple_choice" else banned_phrases
    budget = 3 << 20  # two sets of 32 choices or of 64 phrases of 64 tokens (~1.4 MiB each)
    monkeypatch.setattr(module, "_TABLES", Kept(64, budget))
    rng = random.Random(kind)
    peak = 0
    with traced() as held:
        for _ in range(8):
            sets = [_ids(rng, 64) for _ in range(32 if kind == "multiple_choice" else 64)]
            if kind == "multiple_choice":
                multiple_choice.MultipleChoiceProcessor(sets, 0)
            else:
                banned_phrases.BannedPhrasesProcessor(sets)
            del sets
            peak = max(peak, held())
    assert 2 <= len(module._TABLES) and module._TABLES.held <= budget
    assert peak <= budget, f"the heap holds {peak} bytes beyond the start, the budget is {budget}"


def test_deep_size_counts_each_object_once_and_nothing_shared_by_the_process() -> None:
    row = tuple(range(1000, 1064))
    assert deep_size(row) == deep_size(tuple(range(1000, 1064)))
    assert deep_size((row, row)) == deep_size((row,)) + 8  # one more reference, not another row
    assert deep_size(tuple(range(200))) < deep_size(tuple(range(1000, 1200)))  # CPython's small ints are shared
    assert deep_size((int, None, True, deep_size)) == deep_size((1, 2, 3, 4))
    assert deep_size(row, ints=False) == deep_size(tuple(range(64))) < deep_size(row)
