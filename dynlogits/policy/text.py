"""Resolving text entries into token entries with the worker's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dynlogits.specs import ForcedTextSpec, ForcedTokenSequenceSpec, SpecError

__all__ = ["TextTokenizer", "resolve_entries", "resolve_forced_text"]


class TextTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer this module needs."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def resolve_forced_text(text: str, tokenizer: TextTokenizer, *, path: str = "text") -> ForcedTokenSequenceSpec:
    """``text`` -> ``forced_sequence`` of its tokens (no special tokens), then the tokenizer's EOS."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise SpecError.single(path, "the worker's tokenizer has no EOS token, so a forced text cannot end; set eos_token in the tokenizer config")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise SpecError.single(path, "encodes to no tokens")
    return ForcedTokenSequenceSpec(token_ids=tuple(ids), eos_token_id=int(eos))


def resolve_entries(entries: Sequence[Any], tokenizer: TextTokenizer, *, root: str = "entries") -> tuple[Any, ...]:
    """Entries with every ``forced_text`` replaced by its ``forced_sequence``; others unchanged."""
    return tuple(
        resolve_forced_text(e.text, tokenizer, path=f"{root}[{i}].text") if isinstance(e, ForcedTextSpec) else e
        for i, e in enumerate(entries)
    )
