"""Kind -> processor factory: the built-ins, third-party kinds from entry points, and ``python``.

Third-party packages add a kind by exposing a ``ProcessorKind`` under the entry-point
group ``dynlogits.processors`` (or by calling ``register_kind`` in the engine
process). Their entries are validated by their own pydantic model, so an unknown
or malformed entry is still a ``SpecError`` naming the field.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from dynlogits.processors import BUILTIN_FACTORIES, BaseLogitsProcessor, RealizeContext
from dynlogits.specs import WIRE_KINDS, SpecError

__all__ = [
    "ENTRY_POINT_GROUP",
    "PYTHON_FACTORIES_ENV",
    "Factory",
    "ProcessorKind",
    "factory_for",
    "plugin_kinds",
    "register_kind",
]

ENTRY_POINT_GROUP = "dynlogits.processors"
# Comma-separated import strings the operator allows the ``python`` kind to load.
PYTHON_FACTORIES_ENV = "DYN_LOGITS_PYTHON_FACTORIES"

Factory = Callable[[Any, RealizeContext], BaseLogitsProcessor]


@dataclass(frozen=True)
class ProcessorKind:
    """A third-party kind: its wire name, its entry model, and its factory.

    ``spec_model`` must be a pydantic model with a ``kind: Literal[<kind>]`` field;
    ``factory(entry, ctx)`` returns a fresh processor for one request.
    """

    kind: str
    spec_model: type[BaseModel]
    factory: Factory


_registered: dict[str, ProcessorKind] = {}


def register_kind(kind: ProcessorKind) -> None:
    """Register a kind in this process. Built-in kinds cannot be replaced."""
    if kind.kind in WIRE_KINDS or kind.kind == "forced_text":
        raise ValueError(f"kind {kind.kind!r} is built in and cannot be re-registered")
    _registered[kind.kind] = kind


@cache
def _entry_point_kinds() -> dict[str, ProcessorKind]:
    found: dict[str, ProcessorKind] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if not isinstance(obj, ProcessorKind):
            raise TypeError(f"entry point {ep.name!r} in {ENTRY_POINT_GROUP} must be a ProcessorKind, got {type(obj).__name__}")
        found[obj.kind] = obj
    return found


def plugin_kinds() -> Mapping[str, ProcessorKind]:
    """Every third-party kind visible in this process (entry points, then ``register_kind``)."""
    return {**_entry_point_kinds(), **_registered}


def _allowed_python_factories(environ: Mapping[str, str]) -> frozenset[str]:
    return frozenset(s.strip() for s in environ.get(PYTHON_FACTORIES_ENV, "").split(",") if s.strip())


def _import_factory(path: str) -> Callable[..., Any]:
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check_python_allowed(factory: str, *, path: str, environ: Mapping[str, str] = os.environ) -> None:
    """Raise unless the operator allow-listed ``factory`` for the ``python`` kind."""
    if factory not in _allowed_python_factories(environ):
        raise SpecError.single(
            path, f"factory {factory!r} is not allow-listed on this worker (operator setting {PYTHON_FACTORIES_ENV})"
        )


def _python_factory(entry: Any, ctx: RealizeContext) -> BaseLogitsProcessor:
    processor = _import_factory(entry.factory)(**entry.kwargs)
    if not callable(processor):
        raise TypeError(f"{entry.factory} returned {type(processor).__name__}, which is not a logits processor")
    return processor


def factory_for(kind: str) -> Factory:
    """The factory realizing entries of ``kind``; ``KeyError`` if nobody provides it."""
    if kind == "python":
        return _python_factory
    if kind in BUILTIN_FACTORIES:
        return BUILTIN_FACTORIES[kind]
    return plugin_kinds()[kind].factory
