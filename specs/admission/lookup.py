"""Where admission finds a kind's rules: ``rules_of(entry)``, the ``KindRules`` an entry's kind declares
(``rules``), read by the generic walks. A built-in kind's declaration (``dynlogits.specs.builtin``)
names its rules by import string (its ``admission``: ``RULES`` of the module of this package named
after it); a plug-in's ``ProcessorKind`` may name its own the same way (or give the ``KindRules``
object). A kind that names none is ``OPAQUE``."""

from __future__ import annotations

import importlib
from typing import Any

from ..builtin import BUILTIN
from ..kinds import kinds_generation, plugin_kinds
from .rules import OPAQUE, Entry, KindRules

__all__ = ["OPAQUE", "KindRules", "rules_of", "rules_of_kind"]

#: The rules of each kind seen, imported once per set of kinds in force (``kinds_generation``).
_LOADED: dict[str, KindRules[Any]] = {}
_LOADED_AT = [-1]


def rules_of(entry: Entry) -> KindRules[Any]:
    """The admission rules of ``entry``'s kind (``OPAQUE`` when it declares none). A dict lookup
    once the kind was seen."""
    got = _LOADED.get(entry.kind) if _LOADED_AT[0] == kinds_generation() else None
    return got if got is not None else rules_of_kind(entry.kind)


def rules_of_kind(kind: str) -> KindRules[Any]:
    """The admission rules a kind declares: its built-in declaration's ``admission`` import string,
    or a plug-in kind's ``admission`` (an import string or a ``KindRules``), imported on first use
    and kept while the kinds in force stay the same; ``OPAQUE`` for a kind that names none.

    Raises ``ImportError``, ``AttributeError`` or ``TypeError`` when a declaration names rules
    that do not import as a ``KindRules``."""
    generation = kinds_generation()
    if _LOADED_AT[0] != generation:
        _LOADED.clear()
        _LOADED_AT[0] = generation
    got = _LOADED.get(kind)
    if got is None:
        got = _LOADED[kind] = _load(kind)
    return got


def _load(kind: str) -> KindRules[Any]:
    declared = BUILTIN.get(kind) or plugin_kinds().get(kind)
    target = declared.admission if declared is not None else None
    if target is None:
        return OPAQUE
    if isinstance(target, str):
        module, _, name = target.partition(":")
        found = getattr(importlib.import_module(module), name)
    else:
        found = target
    if not isinstance(found, KindRules):
        raise TypeError(f"kind {kind!r}: admission {target!r} is not a KindRules")
    return found
