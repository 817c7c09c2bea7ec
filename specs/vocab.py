"""The bound check that needs the model: token ids must index the logits row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .errors import Problem, SpecError

__all__ = ["check_vocab", "token_id_fields"]

_ID_LIST_FIELDS = ("token_ids", "start_token_ids", "end_token_ids", "stop_token_ids")


def token_id_fields(entry: Any) -> Iterator[tuple[str, int]]:
    """Yield ``(subpath, id)`` for every token id an entry names."""
    for field in _ID_LIST_FIELDS:
        for j, tid in enumerate(getattr(entry, field, None) or ()):
            yield f"{field}[{j}]", tid
    eos = getattr(entry, "eos_token_id", None)
    if eos is not None:
        yield "eos_token_id", eos
    for key in getattr(entry, "bias", None) or {}:
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
