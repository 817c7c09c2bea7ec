"""Kind -> processor factory, on the engine side: the built-in kinds and third-party ones alike.

Every kind is declared in the torch-free specs layer (``dynlogits.specs.builtin`` for built-ins,
``dynlogits.specs.kinds`` for plug-ins) with its factory as an import string; the factory is
imported here, in the engine. The built-in kinds' processor modules (``dynlogits.processors.<kind>``)
are those the declarations name; nothing here lists a kind."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from dynlogits.specs.builtin import DECLARED
from dynlogits.specs.entries import declaration
from dynlogits.specs.kinds import ProcessorKind, plugin_kinds

from .base import BaseLogitsProcessor, RealizeContext
from .python import PYTHON_FACTORIES_ENV, check_python_allowed, import_factory

__all__ = ["BUILTIN_FACTORIES", "BUILTIN_KINDS", "PYTHON_FACTORIES_ENV", "REALIZED", "Factory", "check_python_allowed",
           "factory_for"]

Factory = Callable[[Any, RealizeContext], BaseLogitsProcessor]


def _module(kind: ProcessorKind) -> ModuleType:
    """The processor module a built-in declaration's factory string names."""
    assert isinstance(kind.factory, str), kind  # built-in factories are import strings (the frontend never imports torch)
    return importlib.import_module(kind.factory.partition(":")[0])


#: The built-in kinds' processor modules, one per kind that builds a processor of ours (``KIND``,
#: ``factory``, its processor and, where it runs on the resident path, its template and group), in
#: the declarations' order. Kinds declared without a factory build none; allow-listed ones
#: (``ProcessorKind.allow_listed``) run the operator's code.
BUILTIN_KINDS: tuple[ModuleType, ...] = tuple(
    _module(k) for k in DECLARED if k.factory is not None and not k.allow_listed)

#: Each factory returns a FRESH processor for one request (no state shared between requests).
BUILTIN_FACTORIES: dict[str, Factory] = {module.KIND: module.factory for module in BUILTIN_KINDS}

#: Kinds whose entry depends on the request's facts (its prompt): ``realized(entry, ctx)`` is the
#: built-in entry it realizes to (``None``: none), which realization checks against the others.
REALIZED: Mapping[str, Callable[[Any, RealizeContext], Any]] = {
    module.KIND: module.realized for module in BUILTIN_KINDS if hasattr(module, "realized")}


def _resolve(kind: ProcessorKind) -> Factory:
    if not isinstance(kind.factory, str):
        if kind.factory is None:
            raise KeyError(kind.kind)
        return kind.factory
    factory = import_factory(kind.factory)
    if not callable(factory):
        raise TypeError(f"factory {kind.factory!r} of kind {kind.kind!r} is a {type(factory).__name__}, not callable")
    return factory


def factory_for(kind: str) -> Factory:
    """The factory realizing entries of ``kind``; ``KeyError`` if nobody provides it. Import errors of a
    plug-in's factory propagate (the caller fails the one request that needed it)."""
    if kind in BUILTIN_FACTORIES:
        return BUILTIN_FACTORIES[kind]
    declared = declaration(kind)
    if declared is None:
        return _resolve(plugin_kinds()[kind])  # KeyError naming the kind
    return _resolve(declared)
