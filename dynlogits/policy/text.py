"""Resolving the text in entries into token ids with the worker's tokenizer (``docs/specs.md``:
text is resolved as given, no special tokens; banned phrases as vLLM resolves ``bad_words``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dynlogits.specs import ForcedTextSpec, ForcedTokenSequenceSpec, SpecError

__all__ = ["TextTokenizer", "encode_text", "phrase_variants", "resolve_entries", "resolve_forced_text", "resolve_text"]


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


def encode_text(text: str, tokenizer: TextTokenizer, *, path: str) -> tuple[int, ...]:
    """``text``'s tokens, no special tokens added; ``SpecError`` at ``path`` when there are none."""
    ids = tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise SpecError.single(path, "encodes to no tokens")
    return ids


def phrase_variants(text: str, tokenizer: TextTokenizer, *, path: str) -> list[tuple[int, ...]]:
    """The token sequences a banned phrase stands for, as vLLM resolves ``bad_words``
    (``SamplingParams.update_from_tokenizer``, vLLM 0.32): the text with its leading spaces removed,
    and with one leading space when that gives a different first token and as many tokens."""
    bare = tuple(int(t) for t in tokenizer.encode(text.lstrip(), add_special_tokens=False))
    if not bare:
        raise SpecError.single(path, "encodes to no tokens")
    spaced = tuple(int(t) for t in tokenizer.encode(" " + text.lstrip(), add_special_tokens=False))
    return [bare, spaced] if spaced and spaced[0] != bare[0] and len(spaced) == len(bare) else [bare]


def _eos(tokenizer: TextTokenizer, path: str) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise SpecError.single(path, "the worker's tokenizer has no EOS token; set eos_token in the tokenizer config")
    return int(eos)


def resolve_text(entry: Any, tokenizer: TextTokenizer, *, path: str) -> Any:
    """``entry`` with its text fields (``text_fields``: text -> the id field it becomes) resolved to
    token ids with ``tokenizer``; an entry without text comes back as it is."""
    if isinstance(entry, ForcedTextSpec):
        return resolve_forced_text(entry.text, tokenizer, path=f"{path}.text")
    unresolved = getattr(entry, "unresolved_text", None)
    if unresolved is None or not unresolved():
        return entry
    update: dict[str, Any] = {}
    for name in unresolved():
        value, target = getattr(entry, name), entry.text_fields[name]
        if isinstance(value, str):
            update[target] = encode_text(value, tokenizer, path=f"{path}.{name}")
        elif entry.kind == "banned_phrases":
            phrases = list(entry.phrases)
            for j, text in enumerate(value):
                phrases += [v for v in phrase_variants(text, tokenizer, path=f"{path}.{name}[{j}]") if v not in phrases]
            update[target] = tuple(phrases)
        else:
            update[target] = (*getattr(entry, target), *(encode_text(t, tokenizer, path=f"{path}.{name}[{j}]")
                                                         for j, t in enumerate(value)))
        update[name] = None if isinstance(value, str) else ()
    if entry.kind == "multiple_choice" and entry.eos_token_id is None:
        update["eos_token_id"] = _eos(tokenizer, f"{path}.texts")
    return type(entry).model_validate({**entry.model_dump(), **update})


def resolve_entries(entries: Sequence[Any], tokenizer: TextTokenizer, *, root: str = "entries") -> tuple[Any, ...]:
    """Entries with every text resolved to token ids (``forced_text`` becomes its
    ``forced_sequence``); entries without text unchanged."""
    return tuple(resolve_text(e, tokenizer, path=f"{root}[{i}]") for i, e in enumerate(entries))
