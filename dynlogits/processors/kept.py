"""``Kept``: what a process keeps to skip repeated work (decoded payloads, a choice set's tables),
bounded by a count and by the bytes it holds, so clients that vary their payloads cannot grow it.

``deep_size`` is how a value is weighed: the bytes its objects take on the heap, estimated from
``sys.getsizeof`` and rounded up to the allocator's 16 bytes, never below what ``tracemalloc``
measures for real tables (``tests/processors/test_kept.py``)."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from itertools import chain, compress
from operator import not_
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any, Generic, TypeVar

__all__ = ["INT_BYTES", "Kept", "deep_size", "shallow_size"]

V = TypeVar("V")

#: objects shared by the whole process: never counted
_SHARED = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType, bool, type(None), type(Ellipsis))
_SEQUENCES = (tuple, list, set, frozenset)
_LEAVES = (str, bytes, bytearray, float, complex)
#: what an int takes on the heap: 28 or 32 bytes below 2**60, rounded up to pymalloc's 16
INT_BYTES = 32
_INT = {int}
#: the ints CPython caches (never allocated per reference)
_CACHED_INTS = frozenset(range(-5, 257))
_getsizeof = sys.getsizeof
_values = dict.values


def _heap(objects: Iterable[Any], rounding: int = 8) -> int:
    """The blocks ``objects`` take: ``getsizeof`` plus what pymalloc and malloc round it up to 16
    bytes with (``rounding``: 8 for containers, whose sizes are multiples of 8)."""
    sizes = list(map(_getsizeof, objects))
    return sum(sizes) + rounding * len(sizes)


def shallow_size(objects: Iterable[object]) -> int:
    """The bytes the containers ``objects`` take themselves on the heap (not what they reference),
    each as often as given: for a table's weigher that knows its own objects (one C-level pass
    over them, where ``deep_size`` would walk every reference)."""
    return _heap(objects)


def deep_size(obj: object, *, ints: bool = True) -> int:
    """The bytes ``obj`` holds on the heap: itself and every object it reaches through containers,
    instance dicts and slots, each object once, an int ``INT_BYTES`` per reference (``ints=False``:
    none, for ints counted elsewhere, e.g. the ids a table shares with its key); classes,
    functions, modules, ``None`` and booleans count nothing; a numpy array or a tensor counts its
    buffer too.

    An upper estimate of what dropping the last reference to ``obj`` frees (objects it shares with
    others count too, and so do the small ints CPython caches unless all their level is ints),
    for weighing what a ``Kept`` holds. It walks level by level with C-level maps: an int costs a
    type check, a container a few dict operations."""
    seen: set[int] = set()
    total = 0
    todo: list[list[Any]] = [[obj]]  # lists of objects: what one group of containers holds
    while todo:
        level = todo.pop()
        kinds = set(map(type, level))
        if kinds == _INT:  # the most frequent list: the ids of token tuples
            if ints:
                total += INT_BYTES * (len(level) - sum(map(_CACHED_INTS.__contains__, level)))
            continue
        skip = {kind for kind in kinds if kind is int or issubclass(kind, _SHARED)}
        if skip:
            types = list(map(type, level))
            if ints and int in skip:
                total += INT_BYTES * types.count(int)
            kinds -= skip
            if not kinds:
                continue
            level = list(compress(level, map(not_, map(skip.__contains__, types))))
        found = dict(zip(map(id, level), level))  # in their order: the walk reads memory in sequence
        objects = list(compress(found.values(), map(not_, map(seen.__contains__, found))))
        seen.update(found)
        for kind in kinds:
            group = objects if len(kinds) == 1 else [o for o in objects if type(o) is kind]
            if not group:
                continue
            total += _heap(group, 15 if issubclass(kind, _LEAVES) else 8)
            if issubclass(kind, _SEQUENCES):
                total += _held_by(group, group, ints, todo)
            elif issubclass(kind, dict):
                total += _held_by(group, group, ints, todo) + _held_by(group, list(map(_values, group)), ints, todo)
            elif not issubclass(kind, _LEAVES):
                parts: list[Any] = []
                for o in group:
                    parts.extend(_parts(o))
                    total += _buffer(o)
                todo.append(parts)
    return total


def _held_by(group: list[Any], iterables: list[Any], ints: bool, todo: list[list[Any]]) -> int:
    """What ``iterables`` (``group``'s items, or its dicts' values) hold when they are all ints
    (the bytes: ``deep_size`` counts each reference); else nothing yet: they go on ``todo``."""
    if set(map(type, chain.from_iterable(iterables))) != _INT:
        todo.append(list(chain.from_iterable(iterables)))
        return 0
    if not ints:
        return 0
    return INT_BYTES * (sum(map(len, group)) - sum(map(_CACHED_INTS.__contains__, chain.from_iterable(iterables))))


def _parts(o: Any) -> list[Any]:
    """What an object of no container type references: its instance dict and its slots."""
    parts = [vars(o)] if hasattr(o, "__dict__") else []
    for cls in type(o).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(o, name):
                parts.append(getattr(o, name))
    return parts


def _buffer(o: Any) -> int:
    """The data a tensor's storage holds beside its object (0 for anything else: a numpy array's
    ``getsizeof`` counts the buffer it owns)."""
    storage = getattr(o, "untyped_storage", None)
    return int(storage().nbytes()) if callable(storage) else 0


class Kept(Generic[V]):
    """A thread-safe LRU of at most ``count`` values holding at most ``size`` bytes in all, each
    value weighed with its key (``deep_size((key, value))`` unless the caller weighs it); the
    least recently used go first, and a value heavier than the whole budget is not kept."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """The bytes the kept values weigh in all (at most ``size``)."""
        return self._held

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, weight: int | None = None) -> None:
        """Keep ``value`` for ``key`` at ``weight`` bytes (``None``: ``deep_size((key, value))``),
        dropping the least recently used until the count and the bytes fit."""
        if weight is None:
            if key in self._items:
                return
            weight = deep_size((key, value))
        with self._lock:
            if weight > self.size or key in self._items:
                return
            self._items[key] = (value, weight)
            self._held += weight
            while len(self._items) > self.count or self._held > self.size:
                self._held -= self._items.popitem(last=False)[1][1]

    def made(self, key: Hashable, make: Callable[[], V], weigh: Callable[[V], int] | None = None) -> V:
        """The value kept for ``key``, else ``make()`` kept at ``weigh(value)`` bytes (``None``: its
        and its key's ``deep_size``); made and weighed outside the lock."""
        hit = self.get(key)
        if hit is None:
            hit = make()
            self.put(key, hit, None if weigh is None else weigh(hit))
        return hit

    def emptied(self) -> Kept[V]:
        """A new, empty one with the same bounds."""
        return Kept(self.count, self.size)

    def __len__(self) -> int:
        return len(self._items)
