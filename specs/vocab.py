"""The bound check that needs the model: token ids must index the logits row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from .errors import Problem, SpecError

__all__ = ["check_vocab", "token_id_fields"]

# Fields are found by name, on built-in and plug-in entries alike.
_ID_LIST_FIELDS = ("token_ids", "start_token_ids", "end_token_ids", "stop_token_ids")
_ID_FIELDS = ("token_id", "eos_token_id")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def token_id_fields(entry: Any) -> Iterator[tuple[str, int]]:
    """Yield ``(subpath, id)`` for every token id an entry names.

    Ids live in ``token_ids``, ``start_token_ids``, ``end_token_ids``, ``stop_token_ids``
    (lists), ``token_id``, ``eos_token_id`` and the keys of ``bias``. A field of another
    shape (a plug-in's string ``token_id``, say) is not an id and is skipped.
    """
    for field in _ID_LIST_FIELDS:
        values = getattr(entry, field, None)
        if isinstance(values, (list, tuple)):
            for j, tid in enumerate(values):
                if _is_id(tid):
                    yield f"{field}[{j}]", tid
    for field in _ID_FIELDS:
        tid = getattr(entry, field, None)
        if _is_id(tid):
            yield field, tid
    bias = getattr(entry, "bias", None)
    if isinstance(bias, Mapping):
        for key in bias:
            if _is_id(key):
                yield f'bias["{key}"]', key
            elif isinstance(key, str) and key.isascii() and key.isdigit():
                yield f'bias["{key}"]', int(key)


@lru_cache(maxsize=256)
def _id_fields_of(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """The id-bearing fields a model class declares (reading an absent attribute of a pydantic
    model raises, which costs microseconds: look only where a field exists)."""
    declared = getattr(cls, "model_fields", None)
    if declared is None:
        return _ID_LIST_FIELDS, _ID_FIELDS, True
    names = set(declared)
    return (tuple(f for f in _ID_LIST_FIELDS if f in names), tuple(f for f in _ID_FIELDS if f in names), "bias" in names)


def _largest_id(entry: Any) -> int:
    """The largest id an entry names (-1 for none): the cheap pass before any message is built."""
    largest = -1
    list_fields, id_fields, has_bias = _id_fields_of(type(entry))
    for field in list_fields:
        values = getattr(entry, field, None)
        if isinstance(values, (list, tuple)) and values:
            try:
                top = max(values)  # validated ids: plain ints, compared at C speed
            except TypeError:  # a plug-in field of mixed types: only its ids count
                ints = [v for v in values if _is_id(v)]
                top = max(ints) if ints else -1
            if _is_id(top):
                largest = max(largest, top)
            elif top is not None and not isinstance(top, str):
                ints = [v for v in values if _is_id(v)]
                largest = max(largest, max(ints) if ints else -1)
    for field in id_fields:
        tid = getattr(entry, field, None)
        if _is_id(tid):
            largest = max(largest, tid)
    bias = getattr(entry, "bias", None) if has_bias else None
    if isinstance(bias, Mapping) and bias:
        try:  # validated keys: decimal strings (or ints)
            largest = max(largest, max(int(k) for k in bias))
        except (TypeError, ValueError):  # a plug-in's keys of another shape: only its ids count
            largest = max([largest, *(tid for _, tid in token_id_fields(entry))])
    return largest


def check_vocab(entries: Sequence[Any], vocab_size: int, *, root: str) -> None:
    """Raise ``SpecError`` naming every id ``>= vocab_size``.

    ``vocab_size`` is the width of the logits tensor (often padded beyond the
    tokenizer's length), not ``len(tokenizer)``.
    """
    if all(_largest_id(entry) < vocab_size for entry in entries):
        return  # the common case: no message to build
    problems = [
        Problem(f"{root}[{i}].{sub}", f"must be < vocab size {vocab_size}")
        for i, entry in enumerate(entries)
        for sub, tid in token_id_fields(entry)
        if tid >= vocab_size
    ]
    if problems:
        raise SpecError(problems)
