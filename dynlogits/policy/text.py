"""Resolving the text in entries into token ids with the worker's tokenizer (``docs/specs.md``:
text is resolved as given, no special tokens; banned phrases as vLLM resolves ``bad_words``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel

from dynlogits.specs import DEFAULT_LIMITS, ForcedTextSpec, ForcedTokenSequenceSpec, SpecError, SpecLimits
from dynlogits.specs.entries import declaration, unresolved_text
from dynlogits.specs.entry_base import field_of
from dynlogits.specs.limits import field_limits

__all__ = ["TextTokenizer", "encode_text", "phrase_variants", "resolve_entries", "resolve_forced_text", "resolve_text"]


class TextTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer this module needs."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def resolve_forced_text(text: str, tokenizer: TextTokenizer, *, path: str = "text") -> ForcedTokenSequenceSpec:
    """``text`` -> a ``ForcedTokenSequenceSpec`` of its tokens (no special tokens), then the tokenizer's EOS."""
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


def _bounded(ids: tuple[int, ...], limit: str | None, limits: SpecLimits, *, path: str) -> tuple[int, ...]:
    """``ids`` (a text's tokens), or ``SpecError`` at ``path`` when they exceed ``limits.<limit>``."""
    bound = getattr(limits, limit) if limit is not None else None
    if bound is not None and len(ids) > bound:
        raise SpecError.single(path, f"is {len(ids)} tokens with this worker's tokenizer; must be at most {bound} (limit {limit})")
    return ids


def resolve_text(entry: BaseModel, tokenizer: TextTokenizer, *, path: str, limits: SpecLimits = DEFAULT_LIMITS) -> Any:
    """``entry`` with its text fields (``text_fields``: text -> the id field it becomes) resolved to
    token ids with ``tokenizer``; an entry without text comes back as it is. What a text becomes is
    held to the id field's ``limits`` (a phrase's two variants count twice), named at the text. How
    its kind's texts resolve is declared with the kind (``ProcessorKind.text_as_bad_words``,
    ``eos_from_tokenizer``)."""
    if isinstance(entry, ForcedTextSpec):
        forced = resolve_forced_text(entry.text, tokenizer, path=f"{path}.text")
        _bounded(forced.token_ids, field_limits("token_ids")[0], limits, path=f"{path}.text")
        return forced
    unresolved = unresolved_text(entry)  # a plug-in model's declared text fields too
    if not unresolved:
        return entry
    declared = declaration(field_of(entry, "kind"))
    text_fields: Mapping[str, str] = getattr(type(entry), "text_fields", {})  # what ``unresolved_text`` read
    as_bad_words = declared is not None and declared.text_as_bad_words
    update: dict[str, Any] = {}
    for name in unresolved:
        value, target = getattr(entry, name), text_fields[name]
        length, item = field_limits(target)
        if isinstance(value, str):
            update[target] = _bounded(encode_text(value, tokenizer, path=f"{path}.{name}"), length, limits,
                                      path=f"{path}.{name}")
            update[name] = None
            continue
        items = list(getattr(entry, target))
        seen = set(items)
        for j, text in enumerate(value):
            at = f"{path}.{name}[{j}]"
            found = (phrase_variants(text, tokenizer, path=at) if as_bad_words
                     else [encode_text(text, tokenizer, path=at)])
            for ids in found:
                if ids not in seen:
                    seen.add(_bounded(ids, item, limits, path=at))
                    items.append(ids)
        if length is not None and len(items) > getattr(limits, length):
            raise SpecError.single(f"{path}.{name}", f"resolves to {len(items)} token sequences with this worker's "
                                                     f"tokenizer; must be at most {getattr(limits, length)} (limit {length})")
        update[target], update[name] = tuple(items), ()
    eos_field = declared.eos_from_tokenizer if declared is not None else None
    if eos_field is not None and getattr(entry, eos_field) is None:
        update[eos_field] = _eos(tokenizer, f"{path}.{unresolved[0]}")
    return type(entry).model_validate({**entry.model_dump(), **update})


def resolve_entries(entries: Sequence[BaseModel], tokenizer: TextTokenizer, *, root: str = "entries",
                    limits: SpecLimits = DEFAULT_LIMITS) -> tuple[Any, ...]:
    """Entries with every text resolved to token ids (a ``ForcedTextSpec`` becomes its
    ``ForcedTokenSequenceSpec``), held to ``limits``; entries without text unchanged."""
    return tuple(resolve_text(e, tokenizer, path=f"{root}[{i}]", limits=limits) for i, e in enumerate(entries))
