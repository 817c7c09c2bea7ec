"""The bound check that needs the model: token ids must index the logits row.

An id is found wherever an entry's model declares one, however nested: a field (or an item of a
list, tuple or dict, or a field of a nested model) annotated with ``specs.entries.TokenId`` /
``TokenIds`` (marked with ``TOKEN_ID``), and the keys of ``TokenKey``-keyed maps (a bias map).
Plug-in kinds get the same check by using those types in their models.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Annotated, Any, TypeGuard, Union, get_args, get_origin

from pydantic import BaseModel

from .errors import Problem, SpecError

__all__ = ["BUILTIN_ENTRY_CLASSES", "TOKEN_ID", "TOKEN_KEY", "check_vocab", "token_id_fields"]


class _Mark:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Annotation metadata marking an int as a token id, or a decimal string as a token id's key.
TOKEN_ID = _Mark("TOKEN_ID")
TOKEN_KEY = _Mark("TOKEN_KEY")

# Fields are found by name on built-in entries (the fast pass): lists of ids, single ids, lists of id lists.
_ID_LIST_FIELDS = ("token_ids", "start_token_ids", "end_token_ids", "stop_token_ids", "trigger_token_ids",
                   "phrase_token_ids")
_ID_FIELDS = ("token_id", "eos_token_id")
_ID_LISTS_FIELDS = ("phrases", "choices")

Walker = Callable[[Any, str], Iterator[tuple[str, int]]]


def _nothing(value: Any, path: str) -> Iterator[tuple[str, int]]:
    return iter(())


def _walker(tp: Any) -> Walker:
    """What yields the ``(subpath, id)`` pairs of a value of annotation ``tp``."""
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *meta = get_args(tp)
        if any(m is TOKEN_ID for m in meta):
            return lambda value, path: iter([(path, value)] if _is_id(value) else [])
        if any(m is TOKEN_KEY for m in meta):
            return lambda value, path: iter([(path, int(value))] if isinstance(value, str) and value.isascii()
                                            and value.isdigit() else [])
        return _walker(inner)
    if origin in (Union, types.UnionType):
        walkers = [_walker(a) for a in get_args(tp) if a is not type(None)]
        return lambda value, path: (pair for w in walkers for pair in w(value, path))
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        if not args:
            return _nothing
        each = _walker(args[0]) if len(set(map(repr, args))) == 1 else None
        if each is None:
            walkers = [_walker(a) for a in args]
            return lambda value, path: (pair for j, (w, v) in enumerate(zip(walkers, value if isinstance(value, (list, tuple)) else ()))
                                        for pair in w(v, f"{path}[{j}]"))
        return lambda value, path: (pair for j, v in enumerate(value if isinstance(value, (list, tuple)) else ())
                                    for pair in each(v, f"{path}[{j}]"))
    if origin in (dict, Mapping):
        key_type, value_type = get_args(tp) or (Any, Any)
        keys, values = _walker(key_type), _walker(value_type)
        return lambda value, path: (pair for k, v in (value.items() if isinstance(value, Mapping) else ())
                                    for pair in (*keys(k, f'{path}["{k}"]'), *values(v, f'{path}["{k}"]')))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        fields = _model_walkers(tp)
        return lambda value, path: (pair for name, w in fields for pair in w(getattr(value, name, None), f"{path}.{name}"))
    return _nothing


@lru_cache(maxsize=256)
def _model_walkers(cls: type[BaseModel]) -> tuple[tuple[str, Walker], ...]:
    walkers = []
    for name, info in cls.model_fields.items():
        tp = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        walker = _walker(tp)
        if walker is not _nothing:
            walkers.append((name, walker))
    return tuple(walkers)


def _is_id(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def token_id_fields(entry: object) -> Iterator[tuple[str, int]]:
    """Yield ``(subpath, id)`` for every token id an entry names (see the module doc); for an
    object that is no pydantic model, the built-in field names are read."""
    seen: set[str] = set()
    if isinstance(entry, BaseModel):
        for name, walker in _model_walkers(type(entry)):
            for path, tid in walker(getattr(entry, name, None), name):
                seen.add(path)
                yield path, tid
    for path, tid in _by_name(entry):  # fields named like the built-ins' ids count whatever their annotation
        if path not in seen:
            yield path, tid


def _by_name(entry: object) -> Iterator[tuple[str, int]]:
    for field in _ID_LISTS_FIELDS:
        lists = getattr(entry, field, None)
        if isinstance(lists, (list, tuple)):
            for j, values in enumerate(lists):
                for k, tid in enumerate(values if isinstance(values, (list, tuple)) else ()):
                    if _is_id(tid):
                        yield f"{field}[{j}][{k}]", tid
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


#: Built-in entry classes, whose ids the fast pass finds by field name (set by ``specs.entries``).
BUILTIN_ENTRY_CLASSES: set[type] = set()


@lru_cache(maxsize=256)
def _id_fields_of(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], bool]:
    """The id-bearing fields a built-in model class declares (reading an absent attribute of a
    pydantic model raises, which costs microseconds: look only where a field exists)."""
    names = set(getattr(cls, "model_fields", {}))
    return (tuple(f for f in _ID_LIST_FIELDS if f in names), tuple(f for f in _ID_FIELDS if f in names),
            tuple(f for f in _ID_LISTS_FIELDS if f in names), "bias" in names)


def _largest_id(entry: object) -> int:
    """The largest id an entry names (-1 for none): the cheap pass before any message is built."""
    if type(entry) not in BUILTIN_ENTRY_CLASSES:
        return max((tid for _, tid in token_id_fields(entry)), default=-1)
    largest = -1
    cls: type = type(entry)
    list_fields, id_fields, lists_fields, has_bias = _id_fields_of(cls)
    for field in list_fields:
        values = getattr(entry, field, None)
        if values:
            largest = max(largest, max(values))  # validated ids: plain ints, compared at C speed
    for field in lists_fields:
        for values in getattr(entry, field, None) or ():
            largest = max(largest, max(values))
    for field in id_fields:
        tid = getattr(entry, field, None)
        if tid is not None:
            largest = max(largest, tid)
    bias = getattr(entry, "bias", None) if has_bias else None
    if bias:
        largest = max(largest, max(int(k) for k in bias))
    return largest


def check_vocab(entries: Sequence[object], vocab_size: int, *, root: str) -> None:
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
