"""Size limits on specs and payloads: the defaults, and an operator's tightened copy."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .entry_like import EntryLike
from .errors import Problem

__all__ = ["DEFAULT_LIMITS", "MAX_ABS_LOGIT_BIAS", "MAX_TOKEN_ID", "SpecLimits",
           "entry_limit_problems", "field_limits", "limit_problems"]

# Token ids are int32 in every engine we target.
MAX_TOKEN_ID = 2**31 - 1
#: Bias values lie in ``[-100, 100]``, the range vLLM clamps its own logit bias to and
#: OpenAI's API documents: enough to make a token certain or impossible, never an overflow to ``inf``
#: (``inf + -inf`` is NaN) in any logits dtype.
MAX_ABS_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class SpecLimits:
    """Bounds every untrusted spec or payload is checked against.

    Operators tighten them (config file ``limits:``); a value of the defaults is
    what a request gets when nobody said otherwise.
    """

    max_entries: int = 16
    max_token_ids: int = 4096
    max_text_chars: int = 4096
    max_bias_entries: int = 2048
    max_budget: int = 1_000_000
    max_phrases: int = 256  # the phrases of a phrase set, the choices of a choice set (and their texts)
    max_phrase_tokens: int = 64  # tokens of one phrase or choice, of a phrase an entry watches for or forces
    max_prompt_tokens: int = 131_072  # the prompt a prompt-bound kind (``reads_prompt``) reads
    #: the most work units (~0.1 µs of CPU each) admission's consistency checks may take on one
    #: payload, bounded from its sizes before any walk (``dynlogits.specs.admission_work``)
    max_admission_work: int = 400_000

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"limits.{name}: must be an integer >= 1, got {value!r}")


DEFAULT_LIMITS = SpecLimits()

# entry field -> the limit that bounds its length
_LENGTH_LIMITS = {
    "token_ids": "max_token_ids",
    "start_token_ids": "max_token_ids",
    "end_token_ids": "max_token_ids",
    "stop_token_ids": "max_token_ids",
    "trigger_token_ids": "max_phrase_tokens",
    "phrase_token_ids": "max_phrase_tokens",
    "phrases": "max_phrases",
    "choices": "max_phrases",
    "texts": "max_phrases",
    "text": "max_text_chars",
    "start_text": "max_text_chars",
    "end_text": "max_text_chars",
    "trigger_text": "max_text_chars",
    "phrase_text": "max_text_chars",
    "bias": "max_bias_entries",
}
# entry field -> the limit that bounds the length of each of its items
_ITEM_LIMITS = {
    "phrases": ("max_phrase_tokens", "items"),
    "choices": ("max_phrase_tokens", "items"),
    "texts": ("max_text_chars", "characters"),
}


def field_limits(name: str) -> tuple[str | None, str | None]:
    """The names of the limits bounding field ``name``'s length and each of its items' (``None``: none)."""
    item = _ITEM_LIMITS.get(name)
    return _LENGTH_LIMITS.get(name), item[0] if item else None


#: the sized types values come as (a plain ``isinstance`` before the ``Sized`` ABC's slower one)
_SIZED = (tuple, list, str, dict, Sized)


def _field(entry: EntryLike, name: str) -> Any:
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


@lru_cache(maxsize=256)
def _bounded_fields(cls: type) -> tuple[tuple[str, ...], bool]:
    """The length-limited fields (and whether ``budget``) a model class declares; every name for
    other objects. Reading an absent attribute of a pydantic model raises, which costs microseconds."""
    declared = getattr(cls, "model_fields", None)
    if declared is None:
        return tuple(_LENGTH_LIMITS), True
    return tuple(f for f in _LENGTH_LIMITS if f in declared), "budget" in declared


@lru_cache(maxsize=256)
def _other_text_fields(cls: type) -> tuple[str, ...]:
    """The text fields a model declares (``text_fields``) under names the table does not bound."""
    return tuple(f for f in getattr(cls, "text_fields", ()) if f not in _LENGTH_LIMITS)


def _text_problems(value: Any, limits: SpecLimits, path: str) -> Iterator[Problem]:
    """One declared text (``max_text_chars``) or several (``max_phrases`` of them, each ``max_text_chars``)."""
    if isinstance(value, str):
        if len(value) > limits.max_text_chars:
            yield Problem(path, f"must have at most {limits.max_text_chars} characters (limit max_text_chars)")
    elif isinstance(value, (list, tuple)):
        if len(value) > limits.max_phrases:
            yield Problem(path, f"must have at most {limits.max_phrases} items (limit max_phrases)")
        for j, item in enumerate(value):
            if isinstance(item, str) and len(item) > limits.max_text_chars:
                yield Problem(f"{path}[{j}]", f"must have at most {limits.max_text_chars} characters (limit max_text_chars)")


def entry_limit_problems(entry: EntryLike, limits: SpecLimits, *, path: str) -> Iterator[Problem]:
    """Yield a problem for every limit one (already type-valid) entry at ``path`` exceeds.

    Fields are found by name, so a plug-in kind's fields of the same names are bounded too
    (a value of another shape, e.g. an integer ``text``, is left to the kind's model); a plug-in
    model's declared text fields (``text_fields``) are bounded as texts whatever their names.
    """
    mapped = entry if isinstance(entry, Mapping) else None  # a raw dict (data not yet validated), else a model
    mapping = mapped is not None
    cls: type = type(entry)
    if not mapping:
        for field in _other_text_fields(cls):
            yield from _text_problems(getattr(entry, field, None), limits, f"{path}.{field}")
    fields, has_budget = _bounded_fields(cls) if not mapping else (tuple(_LENGTH_LIMITS), True)
    for field in fields:
        limit_name = _LENGTH_LIMITS[field]
        value = mapped.get(field) if mapped is not None else getattr(entry, field, None)
        bound = getattr(limits, limit_name)
        if isinstance(value, _SIZED) and len(value) > bound:
            unit = "characters" if isinstance(value, str) else "items"
            yield Problem(f"{path}.{field}", f"must have at most {bound} {unit} (limit {limit_name})")
        elif field in _ITEM_LIMITS and isinstance(value, (list, tuple)):
            item_limit, unit = _ITEM_LIMITS[field]
            item_bound = getattr(limits, item_limit)
            for j, item in enumerate(value):
                if isinstance(item, _SIZED) and len(item) > item_bound:
                    yield Problem(f"{path}.{field}[{j}]", f"must have at most {item_bound} {unit} (limit {item_limit})")
    budget = (mapped.get("budget") if mapped is not None else getattr(entry, "budget", None)) if has_budget else None
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > limits.max_budget:
        yield Problem(f"{path}.budget", f"must be <= {limits.max_budget} (limit max_budget)")


def limit_problems(entries: Sequence[EntryLike], limits: SpecLimits, *, root: str) -> Iterator[Problem]:
    """Yield a problem for every limit the (already type-valid) entries exceed.

    The one place the limits are enforced: the pydantic path and the msgspec
    fast path both call it after type validation, so they agree by construction.
    """
    if len(entries) > limits.max_entries:
        yield Problem(root, f"must have at most {limits.max_entries} entries (limit max_entries)")
    for i, entry in enumerate(entries):
        yield from entry_limit_problems(entry, limits, path=f"{root}[{i}]")
