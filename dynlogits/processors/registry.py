"""Kind -> processor factory, on the engine side: built-ins, third-party kinds, and ``python``.

Third-party kinds are declared in the torch-free specs layer (``dynlogits.specs.kinds``); a factory
given as an import string is imported here, in the engine, when an entry is first realized."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from dynlogits.specs import SpecError
from dynlogits.specs.kinds import ProcessorKind, plugin_kinds

from . import (
    allowed_tokens,
    banned_phrases,
    banned_tokens,
    deadline,
    forced_sequence,
    logit_bias,
    min_tokens,
    multiple_choice,
    prompt_tokens,
    thinking_budget,
    trigger,
)
from .base import BaseLogitsProcessor, RealizeContext

__all__ = ["BUILTIN_FACTORIES", "BUILTIN_KINDS", "PYTHON_FACTORIES_ENV", "REALIZED", "Factory", "check_python_allowed",
           "factory_for"]

# Comma-separated import strings the operator allows the ``python`` kind to load.
PYTHON_FACTORIES_ENV = "DYN_LOGITS_PYTHON_FACTORIES"

Factory = Callable[[Any, RealizeContext], BaseLogitsProcessor]

#: The built-in kinds' modules, one per kind (``KIND``, ``factory``, its processor and, where it runs
#: on the resident path, its template and group): the one place that lists them. ``reasoning``
#: builds no processor (it sets the context's delimiters).
BUILTIN_KINDS = (forced_sequence, banned_tokens, allowed_tokens, logit_bias, min_tokens, thinking_budget, banned_phrases,
                 multiple_choice, trigger, deadline, prompt_tokens)

#: Each factory returns a FRESH processor for one request (no state shared between requests).
BUILTIN_FACTORIES: Mapping[str, Factory] = {module.KIND: module.factory for module in BUILTIN_KINDS}

#: Kinds whose entry depends on the request's facts (its prompt): ``realized(entry, ctx)`` is the
#: built-in entry it realizes to (``None``: none), which realization checks against the others.
REALIZED: Mapping[str, Callable[[Any, RealizeContext], Any]] = {
    module.KIND: module.realized for module in BUILTIN_KINDS if hasattr(module, "realized")}


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


def _plugin_factory(kind: ProcessorKind) -> Factory:
    if not isinstance(kind.factory, str):
        return kind.factory
    factory = _import_factory(kind.factory)
    if not callable(factory):
        raise TypeError(f"factory {kind.factory!r} of kind {kind.kind!r} is a {type(factory).__name__}, not callable")
    return factory


def factory_for(kind: str) -> Factory:
    """The factory realizing entries of ``kind``; ``KeyError`` if nobody provides it. Import errors of a
    plug-in's factory propagate (the caller fails the one request that needed it)."""
    if kind == "python":
        return _python_factory
    if kind in BUILTIN_FACTORIES:
        return BUILTIN_FACTORIES[kind]
    return _plugin_factory(plugin_kinds()[kind])
