"""The one error type every validation path raises, and how pydantic errors become it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .patterns import PATTERN_RULES

__all__ = ["RESOLVED_ON_WORKER", "Key", "Problem", "SpecError", "format_path", "problems_from_pydantic"]

#: Kinds the worker resolves before the wire -> the kind each becomes (filled by ``specs.entries``
#: from the declarations), for the message naming one found on the wire.
RESOLVED_ON_WORKER: dict[str, str] = {}


@dataclass(frozen=True)
class Problem:
    """One broken rule: ``path`` names the field (``entries[0].token_ids[3]``), ``rule`` says why."""

    path: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}" if self.path else self.rule


class SpecError(ValueError):
    """A logits-processor spec or payload broke a rule.

    ``str(error)`` lists every problem as ``path: rule``, separated by ``"; "``.
    It subclasses ``ValueError`` so engines that turn ``ValueError`` into a
    per-request failure (vLLM's ``validate_params``) do so for it too.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        if not problems:
            raise ValueError("SpecError needs at least one problem")
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, path: str, rule: str) -> SpecError:
        return cls([Problem(path, rule)])


class Key(str):
    """A mapping key in a location: formatted as ``["key"]`` instead of ``.key``."""


def format_path(root: str, loc: Iterable[Any]) -> str:
    """``("entries", 0, "token_ids", 3)`` under root ``""`` -> ``entries[0].token_ids[3]``."""
    out = root
    for part in loc:
        if isinstance(part, Key):
            out += f"[{str(part)!r}]".replace("'", '"')
        elif isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _rule(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}"
    if kind in ("too_short", "string_too_short"):
        unit = "character" if kind.startswith("string") else "item"
        n = ctx.get("min_length")
        return f"must have at least {n} {unit}{'s' if n != 1 else ''}"
    if kind in ("too_long", "string_too_long"):
        unit = "character" if kind.startswith("string") else "item"
        return f"must have at most {ctx.get('max_length')} {unit}s"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("string_type",):
        return "must be a string"
    if kind in ("bool_type", "bool_parsing"):
        return "must be a boolean"
    if kind in ("list_type", "tuple_type"):
        return "must be a list"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be an object"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        return PATTERN_RULES.get(pattern, f"must match {pattern}")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "is required"
    tag = ctx.get("tag")
    if kind == "union_tag_invalid" and isinstance(tag, str) and tag in RESOLVED_ON_WORKER:
        return f"kind {tag!r} is resolved to {RESOLVED_ON_WORKER[tag]!r} by the worker and never crosses the wire"
    if kind == "union_tag_invalid":
        return f"unknown kind {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        return "is missing the 'kind' field"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return str(err["msg"])


# Fields whose value is a mapping: their keys are data, not field names.
MAPPING_FIELDS = frozenset({"bias", "kwargs"})


def problems_from_pydantic(
    errors: Sequence[Mapping[str, Any]], *, root: str, tags: frozenset[str]
) -> list[Problem]:
    """Turn ``ValidationError.errors()`` into problems with readable paths.

    Discriminated unions add the tag (the entry's ``kind``) to the location after
    the list index; it is dropped so paths match the payload's shape. A dict key
    that fails shows as ``bias["x"]`` with pydantic's ``[key]`` marker removed.
    """
    out: list[Problem] = []
    locs = [tuple(e["loc"]) for e in errors]
    for err in errors:
        here = tuple(err["loc"])
        if err["type"] == "too_short" and any(len(o) > len(here) and o[: len(here)] == here for o in locs):
            continue  # pydantic counts only the valid items; the inner error says it all
        loc: list[Any] = []
        for i, part in enumerate(err["loc"]):
            prev = err["loc"][i - 1] if i else None
            if isinstance(part, str) and part in tags and (i == 0 or isinstance(prev, int)):
                continue
            if part == "[key]":
                continue
            loc.append(Key(part) if isinstance(part, str) and prev in MAPPING_FIELDS else part)
        out.append(Problem(format_path(root, loc), _rule(err)))
    return out
