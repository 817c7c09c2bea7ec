"""``LogitsProcessorSpec``: what a deployment or request asks to apply, and its parsers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidatorFunctionWrapHandler, field_validator

from .entries import Entry, declaration
from .errors import Problem, SpecError, problems_from_pydantic
from .kinds import plugin_kinds
from .limits import DEFAULT_LIMITS, SpecLimits, limit_problems
from .union import kind_tags, open_entries, sequence_adapter

__all__ = ["LogitsProcessorSpec", "parse_entries", "parse_spec"]


class LogitsProcessorSpec(BaseModel):
    """Entries to apply, in order, to every step's logits of a request.

    ``generation_only`` (default) keeps the entries off roles that do not emit the
    visible token stream (prefill, encode). Entries are immutable data; engines
    realize fresh processors from them for each request.
    """
    # (The docstring is the published schema's description: specs/spec.schema.json.)

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: tuple[Entry, ...] = Field(min_length=1)
    generation_only: StrictBool = True

    # Entries of plug-in kinds in force (dynlogits.specs.kinds) are accepted like built-in ones.
    @field_validator("entries", mode="wrap")
    @classmethod
    def _admit_plugin_kinds(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return open_entries(value, handler, min_length=1)


def _raise_pydantic(err: ValidationError, root: str, tags: frozenset[str]) -> NoReturn:
    raise SpecError(problems_from_pydantic(err.errors(), root=root, tags=tags)) from None


def parse_spec(data: Any, *, limits: SpecLimits = DEFAULT_LIMITS) -> LogitsProcessorSpec:
    """Validate an untrusted mapping (config file) into a spec; ``SpecError`` on any problem."""
    plugins = plugin_kinds()  # a broken plug-in raises its own KindError here, not a field error
    try:
        spec = LogitsProcessorSpec.model_validate(data)
    except ValidationError as err:
        _raise_pydantic(err, "", kind_tags(plugins))
    problems = list(limit_problems(spec.entries, limits, root="entries"))
    if problems:
        raise SpecError(problems)
    return spec


def parse_entries(
    data: Any,
    *,
    root: str = "logits_processors",
    limits: SpecLimits = DEFAULT_LIMITS,
    allowed_kinds: Sequence[str] | None = None,
) -> tuple[Entry, ...]:
    """Validate a client's list of entries (e.g. a request body field).

    ``allowed_kinds`` is the operator's allow-list (``None``: every kind but the
    forbidden ones); plug-in kinds are allowed like built-in ones. A kind declared
    ``client_allowed=False`` (operator code) is never accepted here: it would run code on a worker. Size limits are checked on the raw
    data first, so an oversized list is refused with its limit before any model validates it.
    """
    if isinstance(data, list):
        oversized = list(limit_problems(data, limits, root=root))
        if oversized:
            raise SpecError(oversized)
    plugins = plugin_kinds()
    try:
        entries = sequence_adapter(plugins, wire=False).validate_python(data)
    except ValidationError as err:
        _raise_pydantic(err, root, kind_tags(plugins))
    problems = list(limit_problems(entries, limits, root=root))
    for i, entry in enumerate(entries):
        declared = declaration(entry.kind, plugins)
        if declared is not None and not declared.client_allowed:
            problems.append(Problem(f"{root}[{i}].kind", f"kind {entry.kind!r} is operator-only and may not be sent in a request"))
        elif allowed_kinds is not None and entry.kind not in allowed_kinds:
            problems.append(Problem(f"{root}[{i}].kind", f"kind {entry.kind!r} is not allowed by this deployment (allowed: {sorted(allowed_kinds)})"))
    if problems:
        raise SpecError(problems)
    return tuple(entries)
