"""The tokenizer's vocabulary as strings, built once per engine and only when a factory asks."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Vocabulary", "tokenizer_strings"]


def tokenizer_strings(tokenizer: Any) -> list[str]:
    """Each id's text for a Hugging Face style tokenizer (``len`` and ``decode``; ``batch_decode``
    where it has one): id ``i``'s text is what ``[i]`` decodes to alone, special tokens included (a
    byte that is part of a longer character decodes to U+FFFD)."""
    ids = [[i] for i in range(len(tokenizer))]
    batch = getattr(tokenizer, "batch_decode", None)
    if callable(batch):
        return list(batch(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    return [tokenizer.decode(one) for one in ids]


class Vocabulary:
    """Each token id's text, index = id, from ``load`` on the first ``strings()`` and kept.

    One instance per engine (an adapter builds it once and hands it to every request): kinds that
    never ask cost nothing, and those that do pay once. Ids from ``len(strings())`` up to the logits
    width (a padded vocabulary) have no text. ``strings()`` raises what ``load`` raises, each time
    it is asked again (nothing is kept from a failed load). Thread-safe."""

    __slots__ = ("_load", "_lock", "_strings")

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._strings: tuple[str, ...] | None = None

    def strings(self) -> tuple[str, ...]:
        """Every id's text (loaded on the first call)."""
        if self._strings is None:
            with self._lock:
                if self._strings is None:
                    self._strings = tuple(self._load())
        return self._strings

    @classmethod
    def of_tokenizer(cls, tokenizer: Any) -> Vocabulary | None:
        """The vocabulary of a tokenizer (``tokenizer_strings``, on first use), one per tokenizer
        object while it lives (requests of one engine share it); ``None`` for ``None``."""
        if tokenizer is None:
            return None
        try:
            kept = _BY_TOKENIZER.get(tokenizer)
        except TypeError:  # not hashable or not weakly referable: a vocabulary of its own
            return cls(lambda: tokenizer_strings(tokenizer))
        if kept is None:
            kept = cls(lambda: tokenizer_strings(tokenizer))
            _BY_TOKENIZER[tokenizer] = kept
        return kept

    def __repr__(self) -> str:
        state = "not loaded" if self._strings is None else f"{len(self._strings)} tokens"
        return f"Vocabulary({state})"


#: One vocabulary per live tokenizer object (``Vocabulary.of_tokenizer``).
_BY_TOKENIZER: weakref.WeakKeyDictionary[Any, Vocabulary] = weakref.WeakKeyDictionary()
