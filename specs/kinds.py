"""Kinds: how one is declared (built in or third-party), and where a process finds them.

Every kind, built in or not, is one ``ProcessorKind``: the built-in ones are declared in
``dynlogits.specs.builtin`` (``builtin=True``, one module per kind), third-party ones are
published as a ``ProcessorKind`` object in the entry-point group
``dynlogits.processors``, named after its kind::

    [project.entry-points."dynlogits.processors"]
    ban_range = "acme_logits.kinds:BAN_RANGE"

Every process that validates entries loads these objects: the frontend and the
``dynlogits`` CLI too, which must not import torch. So the module an entry point
names must be torch-free (pydantic is fine), and its ``factory`` should be an
import string (``"acme_logits.processors:make_ban_range"``) that only the engine
imports, when it realizes an entry (``dynlogits.processors.registry``).

This module imports neither torch nor an engine.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from .admission.rules import KindRules
from .entry_base import EntryLike
from .errors import Problem, SpecError
from .patterns import FACTORY_PATTERN

__all__ = [
    "BUILTIN_PACKAGE",
    "ENTRY_POINT_GROUP",
    "KIND_NAME_PATTERN",
    "KindError",
    "ProcessorKind",
    "installed_kinds",
    "kinds_generation",
    "kinds_registered",
    "plugin_kinds",
    "register_kind",
]

log = logging.getLogger("dynlogits.specs")

ENTRY_POINT_GROUP = "dynlogits.processors"
#: A kind's name: lower-case words, optionally namespaced with dots (``acme.ban_range``).
KIND_NAME_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"


class KindError(SpecError):
    """A published kind broke a publication rule. The path names the kind or its entry point.

    A ``SpecError``, so processes that refuse a bad logits config at start-up refuse a
    broken plug-in the same way.
    """

    def __init__(self, where: str, rule: str) -> None:
        super().__init__([Problem(where, rule)])


#: The names of the built-in kinds, each added as its declaration is made: the package's
#: ``__init__`` imports ``dynlogits.specs.builtin`` before any plug-in can be declared.
_BUILTIN_NAMES: set[str] = set()

#: The module prefix a built-in kind's declaration lives under (``ProcessorKind.builtin``).
BUILTIN_PACKAGE = "dynlogits.specs.builtin."


@dataclass(frozen=True)
class ProcessorKind:
    """A kind: its wire name, its entry model, its factory, and what the layers above need to know.

    ``spec_model`` is a pydantic model with a ``kind: Literal["<kind>"]`` field that
    forbids unknown fields; it validates entries wherever they appear (config,
    request, payload). ``factory(entry, ctx)`` returns a fresh processor for one
    request; as ``"package.module:name"`` it is imported only by the engine, on
    first use (``None``: the entry builds no processor; built-in kinds only). A
    ``text_fields`` class variable on ``spec_model`` (text field -> id field) declares
    text the worker resolves with its tokenizer before the entry crosses the wire.

    The optional fields (docs/specs.md, "Kinds"; ``wire``, ``resolves_to``, ``delimiters``,
    ``reads_prompt``, ``allow_listed`` and ``fast_model`` are read for built-in kinds only, the
    others for plug-ins too):

    * ``fast_model``: a msgspec twin of ``spec_model`` tagged with the kind (same fields and
      rules), the worker's fast decode (``None``: decoded by ``spec_model``). The fast path
      reads the built-in kinds' twins; a plug-in's entries are decoded by its ``spec_model``.
    * ``wire``: entries cross the engine boundary; ``False``: the worker resolves each into a
      ``resolves_to`` entry first.
    * ``client_allowed``: a client request may carry it (``False``: operator config only).
    * ``allow_listed``: the factory runs code the entry names, only where the worker's operator
      allow-lists it; such a kind is no processor of ours.
    * ``admission``: the kind's admission rules (``dynlogits.specs.admission.rules.KindRules``),
      or an import string naming them, imported only where entries are checked for
      contradictions (``None``: opaque to admission; a row it empties fails its request).
    * ``delimiters``: an entry declares the request's reasoning delimiters (at most one per
      payload; a request's replaces the deployment's).
    * ``reads_prompt``: its processor reads the request's prompt (``limits.max_prompt_tokens``).
    * ``needs_stop_token(entry)``: the entry realizes only for a request with a stop token;
      ``stop_token_use`` says what it does with it (error messages).
    * ``reads_delimiters(entry)``: the entry acts by the phases the delimiters mark even with
      ``scope`` ``always``.
    * ``text_as_bad_words``: its several texts resolve as vLLM resolves ``bad_words`` (as given
      and with one leading space); ``eos_from_tokenizer``: the id field set to the tokenizer's
      EOS when texts were resolved and it is unset.
    * ``conflicts_with``: engine sampling parameters one request may not set beside such an entry.

    Raises ``KindError`` naming the kind and the rule when a field breaks one; a plug-in
    cannot take a built-in kind's name, and ``builtin`` is for ``dynlogits.specs.builtin`` alone.
    """

    kind: str
    spec_model: type[BaseModel]
    factory: str | Callable[..., Any] | None
    fast_model: type | None = None
    wire: bool = True
    client_allowed: bool = True
    allow_listed: bool = False
    admission: str | KindRules[Any] | None = None
    resolves_to: str | None = None
    delimiters: bool = False
    reads_prompt: bool = False
    needs_stop_token: Callable[[EntryLike], bool] | None = None
    stop_token_use: str = ""
    reads_delimiters: Callable[[EntryLike], bool] | None = None
    text_as_bad_words: bool = False
    eos_from_tokenizer: str | None = None
    conflicts_with: tuple[str, ...] = ()
    builtin: bool = False

    def __post_init__(self) -> None:
        where = f"ProcessorKind {self.kind!r}"
        if not isinstance(self.kind, str) or not re.fullmatch(KIND_NAME_PATTERN, self.kind):
            raise KindError(where, f"kind must match {KIND_NAME_PATTERN}")
        if self.builtin:
            if not getattr(self.spec_model, "__module__", "").startswith(BUILTIN_PACKAGE):
                raise KindError(where, f"only the kinds declared in {BUILTIN_PACKAGE.rstrip('.')} are built in")
        elif self.kind in _BUILTIN_NAMES:
            raise KindError(where, f"kind {self.kind!r} is built in and cannot be re-registered by a plug-in")
        if not (isinstance(self.spec_model, type) and issubclass(self.spec_model, BaseModel)):
            raise KindError(where, "spec_model must be a pydantic BaseModel subclass")
        field = self.spec_model.model_fields.get("kind")
        if field is None or get_origin(field.annotation) is not Literal or get_args(field.annotation) != (self.kind,):
            raise KindError(where, f"spec_model {self.spec_model.__name__} must declare kind: Literal[{self.kind!r}]")
        if self.spec_model.model_config.get("extra") != "forbid":
            raise KindError(where, f"spec_model {self.spec_model.__name__} must forbid unknown fields "
                                   "(model_config = ConfigDict(extra='forbid'))")
        _check_text_fields(self.spec_model, where)
        if isinstance(self.factory, str):
            if not re.fullmatch(FACTORY_PATTERN, self.factory):
                raise KindError(where, "factory must be callable or an import string 'package.module:name'")
        elif not callable(self.factory) and not (self.factory is None and self.builtin):
            raise KindError(where, "factory must be callable or an import string 'package.module:name'")
        if isinstance(self.admission, str):
            if not re.fullmatch(FACTORY_PATTERN, self.admission):
                raise KindError(where, "admission must be a KindRules or an import string 'package.module:name'")
        elif self.admission is not None and not isinstance(self.admission, KindRules):
            raise KindError(where, "admission must be a KindRules or an import string 'package.module:name'")
        if not self.wire and self.resolves_to is None:
            raise KindError(where, "a kind that does not cross the wire names the kind it resolves to (resolves_to)")
        if self.builtin:
            _BUILTIN_NAMES.add(self.kind)


def _check_text_fields(model: type[BaseModel], where: str) -> None:
    """A model's ``text_fields`` (text field -> the id field the worker resolves it into) name two of
    its fields each, and both are optional alike: default ``None`` (one text -> its ids) or ``()``
    (several texts -> one id sequence each, after the id field's own)."""
    declared = getattr(model, "text_fields", {})
    if not isinstance(declared, Mapping):
        raise KindError(where, f"spec_model {model.__name__}.text_fields must be a mapping of text field -> id field "
                               "(declare it as text_fields: ClassVar[Mapping[str, str]])")
    fields = model.model_fields
    for text, ids in declared.items():
        if text not in fields or ids not in fields or text == ids:
            raise KindError(where, f"spec_model {model.__name__}.text_fields maps {text!r} -> {ids!r}: each must "
                                   "name a field of the model, a text field and another, its id field")
        defaults = (fields[text].default, fields[ids].default)
        if defaults not in ((None, None), ((), ())):
            raise KindError(where, f"spec_model {model.__name__}: text field {text!r} and id field {ids!r} must both "
                                   "default to None (one text) or both to () (several texts)")


_registered: dict[str, ProcessorKind] = {}
_generation = [0]  # bumped whenever the kinds registered in this process change


def _changed() -> None:
    _generation[0] += 1


def kinds_generation() -> int:
    """A number that changes whenever the kinds in force in this process change (what a cache of
    decoded payloads keys on: a payload valid under one set of kinds may not be under another)."""
    return _generation[0]


def register_kind(kind: ProcessorKind) -> None:
    """Add (or replace) a kind in this process only; entry points are how a package publishes one."""
    if not isinstance(kind, ProcessorKind):
        raise TypeError(f"register_kind takes a ProcessorKind, got {type(kind).__name__}")
    _registered[kind.kind] = kind
    _changed()


@contextmanager
def kinds_registered(*added: ProcessorKind) -> Iterator[None]:
    """``register_kind`` for the duration of a block (tests, the conformance kit); afterwards the
    kinds registered in this process are exactly those before it."""
    before = dict(_registered)
    for kind in added:
        register_kind(kind)
    try:
        yield
    finally:
        _registered.clear()
        _registered.update(before)
        _changed()


def _describe(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    origin = f", distribution {dist.name}" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value!r} (group {ENTRY_POINT_GROUP}{origin})"


def _load(ep: EntryPoint) -> ProcessorKind:
    where = _describe(ep)
    had_torch = "torch" in sys.modules
    try:
        obj = ep.load()
    except KindError as err:
        raise KindError(where, err.problems[0].rule) from None
    except Exception as err:  # noqa: BLE001 - any import failure, reported with its entry point
        raise KindError(where, f"cannot be loaded: {type(err).__name__}: {err}") from err
    if not isinstance(obj, ProcessorKind):
        raise KindError(where, f"must name a dynlogits.specs.kinds.ProcessorKind, got {type(obj).__name__}")
    if obj.kind != ep.name:
        raise KindError(where, f"must be named after its kind {obj.kind!r}")
    if not had_torch and "torch" in sys.modules:
        log.warning("%s imported torch; keep the kind's module torch-free and give its factory as an import "
                    "string so the frontend never loads torch", where)
    return obj


@cache
def installed_kinds() -> Mapping[str, ProcessorKind]:
    """Every kind published in ``dynlogits.processors``, loaded once per process.

    Raises ``KindError`` naming the entry point and the rule it broke (not a
    ``ProcessorKind``, not named after its kind, import failure, a kind published twice).
    """
    found: dict[str, ProcessorKind] = {}
    where: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        kind = _load(ep)
        if kind.kind in found and found[kind.kind] is not kind:
            raise KindError(_describe(ep), f"kind {kind.kind!r} is already published by {where[kind.kind]}")
        found[kind.kind], where[kind.kind] = kind, _describe(ep)
    return MappingProxyType(found)


def plugin_kinds() -> Mapping[str, ProcessorKind]:
    """Every third-party kind in force in this process: installed ones, then ``register_kind`` ones."""
    installed = installed_kinds()
    if not _registered:
        return installed
    return {**installed, **_registered}
