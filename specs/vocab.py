"""The bound check that needs the model: token ids must index the logits row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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


def check_vocab(entries: Sequence[Any], vocab_size: int, *, root: str) -> None:
    """Raise ``SpecError`` naming every id ``>= vocab_size``.

    ``vocab_size`` is the width of the logits tensor (often padded beyond the
    tokenizer's length), not ``len(tokenizer)``.
    """
    problems = [
        Problem(f"{root}[{i}].{sub}", f"must be < vocab size {vocab_size}")
        for i, entry in enumerate(entries)
        for sub, tid in token_id_fields(entry)
        if tid >= vocab_size
    ]
    if problems:
        raise SpecError(problems)
