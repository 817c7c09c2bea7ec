"""``Kept``: what a process keeps to skip repeated work (decoded payloads, a choice set's tables),
bounded by a count and by a total weight, so clients that vary their payloads cannot grow it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Kept"]

V = TypeVar("V")


class Kept(Generic[V]):
    """A thread-safe LRU of at most ``count`` values weighing at most ``weight`` in all (the caller
    weighs each value, e.g. in cells or bytes); the least recently used go first, and a value
    heavier than the whole budget is not kept."""

    def __init__(self, count: int, weight: int) -> None:
        self.count, self.weight = count, weight
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: V, weight: int) -> None:
        with self._lock:
            if weight > self.weight or key in self._items:
                return
            self._items[key] = (value, weight)
            self._held += weight
            while len(self._items) > self.count or self._held > self.weight:
                self._held -= self._items.popitem(last=False)[1][1]

    def made(self, key: Hashable, make: Callable[[], V], weigh: Callable[[V], int]) -> V:
        """The value kept for ``key``, else ``make()`` (outside the lock), kept at ``weigh(value)``."""
        hit = self.get(key)
        if hit is None:
            hit = make()
            self.put(key, hit, weigh(hit))
        return hit

    def emptied(self) -> Kept[V]:
        """A new, empty one with the same bounds."""
        return Kept(self.count, self.weight)

    def __len__(self) -> int:
        return len(self._items)
