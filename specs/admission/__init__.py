"""Admission's per-kind rules: ``rules_of(entry)``, the ``KindRules`` an entry's kind declares
(``rules``), read by the generic walks. A built-in kind's rules live in the module of this package
named after it (its ``RULES``); a kind without one, a plug-in's included, is ``OPAQUE``."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .rules import OPAQUE, Entry, KindRules

__all__ = ["OPAQUE", "KindRules", "rules_of", "rules_of_kind"]

#: The rules of each kind seen, imported once per process.
_LOADED: dict[str, KindRules[Any]] = {}


def rules_of(entry: Entry) -> KindRules[Any]:
    """The admission rules of ``entry``'s kind (``OPAQUE`` when it declares none). A dict lookup
    once the kind was seen."""
    got = _LOADED.get(entry.kind)
    return got if got is not None else rules_of_kind(entry.kind)


def rules_of_kind(kind: str) -> KindRules[Any]:
    """The admission rules a kind declares: ``RULES`` of this package's module named after it,
    imported on first use and kept; ``OPAQUE`` when there is none."""
    got = _LOADED.get(kind)
    if got is None:
        got = _LOADED[kind] = _load(kind)
    return got


def _load(kind: str) -> KindRules[Any]:
    name = f"{__name__}.{kind}"
    if not kind.isidentifier() or importlib.util.find_spec(name) is None:
        return OPAQUE
    found = getattr(importlib.import_module(name), "RULES", None)
    return found if isinstance(found, KindRules) else OPAQUE
