"""The ``python`` kind's factory: import the operator's factory an entry names and call it with the
entry's ``kwargs``. It runs code on the worker, so realization allows only the factories the worker's
operator allow-lists (``check_python_allowed``, ``DYN_LOGITS_PYTHON_FACTORIES``); its processor is
the operator's, opaque to the batched and resident paths."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from dynlogits.specs import PythonProcessorSpec, SpecError

from .base import BaseLogitsProcessor, RealizeContext

__all__ = ["PYTHON_FACTORIES_ENV", "check_python_allowed", "factory", "import_factory"]

# Comma-separated import strings the operator allows the ``python`` kind to load.
PYTHON_FACTORIES_ENV = "DYN_LOGITS_PYTHON_FACTORIES"


def _allowed_python_factories(environ: Mapping[str, str]) -> frozenset[str]:
    return frozenset(s.strip() for s in environ.get(PYTHON_FACTORIES_ENV, "").split(",") if s.strip())


def import_factory(path: str) -> Callable[..., Any]:
    """The object an import string ``package.module:name`` (``name`` may be dotted) names; import
    errors and missing attributes propagate."""
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check_python_allowed(factory: str, *, path: str, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ``SpecError`` at ``path`` unless the operator allow-listed ``factory`` for the ``python`` kind."""
    if factory not in _allowed_python_factories(environ):
        raise SpecError.single(
            path, f"factory {factory!r} is not allow-listed on this worker (operator setting {PYTHON_FACTORIES_ENV})"
        )


def factory(entry: PythonProcessorSpec, ctx: RealizeContext) -> BaseLogitsProcessor:
    """The processor the entry's factory returns for ``entry.kwargs``; ``TypeError`` when it is not callable.
    The allow-list is checked where the payload is decoded (``dynlogits.sdk.realization``)."""
    processor = import_factory(entry.factory)(**entry.kwargs)
    if not callable(processor):
        raise TypeError(f"{entry.factory} returned {type(processor).__name__}, which is not a logits processor")
    return processor
