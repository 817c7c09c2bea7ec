"""The wire contract: ``extra_args["dynamo_logits"]`` holds a JSON list of entry dicts.

``encode_entries`` writes it (frontend or worker side); ``decode_wire_payload``
reads it on the engine side: msgspec first (fast path, built-in kinds only),
pydantic for the exact error message when the payload is bad or carries a plug-in
kind (validated by the kind's own model). Both apply the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import Any

import msgspec
from pydantic import BaseModel, ValidationError

from . import fast
from .consistency import check_consistency
from .entries import DELIMITER_KINDS, WIRE_KINDS, declaration, unresolved_text
from .entry_base import EntryLike, field_of
from .errors import Problem, SpecError, problems_from_pydantic
from .kinds import plugin_kinds
from .limits import DEFAULT_LIMITS, SpecLimits, entry_limit_problems
from .union import entry_adapter, kind_tags, sequence_adapter
from .vocab import check_vocab

__all__ = ["ARRIVAL_KEY", "WIRE_KEY", "decode_entries", "decode_fast", "decode_strict", "decode_wire_entry", "decode_wire_payload",
           "encode_entries", "finish_entries", "payload_limit_problems", "payload_max_entries", "request_dump", "wire_dump"]

WIRE_KEY = "dynamo_logits"
#: Beside the payload, in the same carrier: when the request reached the deployment
#: (``time.time()``), for entries that count from it; absent: when it was realized.
ARRIVAL_KEY = "dynamo_logits_arrival"

#: decode twin -> its pydantic model (``fast.FAST_TO_MODEL``, derived from the declarations)
_FAST_TO_MODEL = fast.FAST_TO_MODEL

def encode_entries(entries: Sequence[BaseModel]) -> list[dict[str, Any]]:
    """Entries -> the JSON-safe payload. Kinds that do not cross the wire must be resolved first.

    Built-in wire kinds and the plug-in kinds in force may cross; nothing else.
    """
    payload: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        kind = field_of(entry, "kind")
        if kind not in WIRE_KINDS and kind not in plugin_kinds():
            declared = declaration(kind)
            raise SpecError.single(
                f"{WIRE_KEY}[{i}].kind",
                f"kind {kind!r} cannot cross the wire; resolve it first ({kind} -> {declared.resolves_to})"
                if declared is not None and declared.resolves_to is not None else
                f"kind {kind!r} cannot cross the wire: it is neither built in nor a plug-in kind in force",
            )
        unresolved = unresolved_text(entry)  # plug-in kinds' declared text fields too
        if unresolved:
            raise SpecError.single(f"{WIRE_KEY}[{i}].{unresolved[0]}", _UNRESOLVED)
        payload.append(wire_dump(entry))
    return payload


#: Why an entry still holding text cannot cross the wire.
_UNRESOLVED = "text is resolved to token ids by the worker's tokenizer and never crosses the wire"


def wire_dump(entry: BaseModel) -> dict[str, Any]:
    """One entry's wire form: its JSON dump without ``scope`` when it is ``"always"`` (so the entries
    ai-dynamo 1.6.1 also knows are byte-compatible with its) and without its text fields."""
    dumped = request_dump(entry)
    for name in getattr(entry, "text_fields", ()):
        dumped.pop(name, None)
    return dumped


def request_dump(entry: BaseModel) -> dict[str, Any]:
    """One entry as a request or config carries it: its JSON dump without a ``scope`` of
    ``"always"`` and without the text fields it leaves unset (those it sets stay, for the worker)."""
    dumped = entry.model_dump(mode="json")
    if dumped.get("scope") == "always":
        del dumped["scope"]
    for name in getattr(entry, "text_fields", ()):
        if dumped.get(name) in (None, []):
            dumped.pop(name, None)
    return dumped


def _from_fast(entry: fast.FastEntry) -> Any:
    """The pydantic model of a validated struct, as ``model_construct`` makes it (same fields in the
    same order, the struct's fields set, the rest at their defaults), without its per-field search
    for aliases (a third of a one-entry decode)."""
    construct = _CONSTRUCTORS.get(type(entry))
    if construct is None:
        construct = _CONSTRUCTORS[type(entry)] = _constructor(type(entry), fast.FAST_TO_MODEL[type(entry)])
    return construct(entry)


def _constructor(struct: type, model: type[BaseModel]) -> Callable[[Any], Any]:
    """``struct -> model`` instance (see ``_from_fast``); ``model_construct`` itself for a model that
    needs more than its fields (aliases, a post-init hook, extra fields, required, factory-made or
    mutable defaults beyond the struct's fields)."""
    given = tuple(struct.__struct_fields__)  # type: ignore[attr-defined]  # msgspec sets it on every Struct class
    fields = model.model_fields  # a class attribute on every pydantic 2 (``__pydantic_fields__`` from 2.10)
    plain = (not model.__pydantic_post_init__ and not model.__pydantic_root_model__
             and model.model_config.get("extra") != "allow" and set(given) <= set(fields)
             and all(f.alias is None and f.validation_alias is None for f in fields.values())
             and all(not f.is_required() and f.default_factory is None and isinstance(f.default, _IMMUTABLE)
                     for n, f in fields.items() if n not in given))
    read = attrgetter(*given) if len(given) > 1 else (lambda e: (getattr(e, given[0]),))
    if not plain:
        return lambda entry: model.model_construct(**dict(zip(given, read(entry))))
    template = {name: field.default for name, field in fields.items()}  # model order: the struct's values replace
    new, set_ = model.__new__, object.__setattr__

    def construct(entry: Any) -> Any:
        values = template.copy()
        values.update(zip(given, read(entry)))
        made = new(model)
        set_(made, "__dict__", values)
        set_(made, "__pydantic_fields_set__", set(given))
        set_(made, "__pydantic_extra__", None)
        set_(made, "__pydantic_private__", None)
        return made
    return construct


_CONSTRUCTORS: dict[type, Callable[[Any], Any]] = {}
#: defaults a template may share between instances
_IMMUTABLE = (type(None), str, int, float, bool, tuple, frozenset)


def _passes_post_checks(entry: fast.FastEntry) -> bool:
    """The rules msgspec's types do not carry (each twin's ``passes_post_checks``)."""
    return entry.passes_post_checks()


def decode_fast(payload: Any) -> tuple[Any, ...] | None:
    """The msgspec path (type rules only); ``None`` when it rejects the payload."""
    try:
        if type(payload) is not list:
            return None
        entries = [fast.convert_entry(item) for item in payload]
    except (msgspec.ValidationError, TypeError, UnicodeError):  # msgspec encodes text with lone surrogates
        return None
    if not all(_passes_post_checks(e) for e in entries):
        return None
    return tuple(_from_fast(e) for e in entries)


def decode_strict(payload: Any, *, root: str = WIRE_KEY) -> tuple[Any, ...]:
    """The pydantic path (type rules only; plug-in kinds included); ``SpecError`` naming each bad field."""
    plugins = plugin_kinds()
    try:
        return tuple(sequence_adapter(plugins, wire=True).validate_python(payload))
    except ValidationError as err:
        raise SpecError(problems_from_pydantic(err.errors(), root=root, tags=kind_tags(plugins))) from None


def decode_wire_entry(item: Any, *, path: str, limits: SpecLimits = DEFAULT_LIMITS) -> Any:
    """Validate one entry found at ``path`` (e.g. ``dynamo_logits[2]``)."""
    try:
        raw = fast.convert_entry(item)
        if not _passes_post_checks(raw):
            raise ValueError("a bias value or key outside the rules")
        entry = _from_fast(raw)
    except (msgspec.ValidationError, TypeError, ValueError):
        plugins = plugin_kinds()
        try:
            entry = entry_adapter(plugins, wire=True).validate_python(item)
        except ValidationError as err:
            raise SpecError(problems_from_pydantic(err.errors(), root=path, tags=kind_tags(plugins))) from None
    problems = list(entry_limit_problems(entry, limits, path=path))
    if problems:
        raise SpecError(problems)
    return entry


def decode_wire_payload(
    payload: Any,
    *,
    limits: SpecLimits = DEFAULT_LIMITS,
    vocab_size: int | None = None,
    root: str = WIRE_KEY,
) -> tuple[Any, ...]:
    """Validate an untrusted payload into wire entries, or raise ``SpecError``.

    Accepts only a list (a JSON string is not a payload: nothing client-shaped is
    parsed twice). Built-in-only payloads take the msgspec fast path; entries of
    plug-in kinds in force are validated by their own models. With ``vocab_size``
    also checks every id against it. Entries that contradict each other (a row left with no
    token, ``dynlogits.specs.consistency``) are refused too.
    """
    return finish_entries(decode_entries(payload, limits=limits, root=root), vocab_size=vocab_size, root=root,
                          limits=limits)


def payload_max_entries(limits: SpecLimits) -> int:
    """The most entries one wire payload holds under ``limits``: a payload is a client's own entries
    (at most ``max_entries``) and the deployment's, counted apart (its config is held to
    ``max_entries`` too), plus the deployment's reasoning entry and the test hook's entry."""
    return 2 * limits.max_entries + 2


def payload_limit_problems(entries: Sequence[EntryLike], limits: SpecLimits, *, root: str) -> Iterator[Problem]:
    """``limit_problems`` for a whole wire payload, the deployment's entries and a client's together:
    each entry within ``limits``, their number within ``payload_max_entries(limits)``, so the
    deployment's entries never count against a client's ``max_entries`` (checked where the client's
    own entries are parsed: ``parse_entries``)."""
    bound = payload_max_entries(limits)
    if len(entries) > bound:
        yield Problem(root, f"must have at most {bound} entries (a client's max_entries, {limits.max_entries}, as many "
                            f"of the deployment's, its reasoning entry and the test hook's; limit max_entries)")
    for i, entry in enumerate(entries):
        yield from entry_limit_problems(entry, limits, path=f"{root}[{i}]")


def decode_entries(payload: Any, *, limits: SpecLimits = DEFAULT_LIMITS, root: str = WIRE_KEY) -> tuple[Any, ...]:
    """The first half of ``decode_wire_payload``, which depends on the payload and ``limits`` alone:
    every entry validated, within the limits of a whole payload (``payload_limit_problems``;
    ``SpecError`` naming the field)."""
    entries = decode_fast(payload)
    if entries is None:
        entries = decode_strict(payload, root=root)
    problems: list[Problem] = list(payload_limit_problems(entries, limits, root=root))
    for i, entry in enumerate(entries):
        problems += [Problem(f"{root}[{i}].{name}", _UNRESOLVED) for name in unresolved_text(entry)]
    delimiters = [i for i, entry in enumerate(entries) if entry.kind in DELIMITER_KINDS]
    if len(delimiters) > 1:
        problems.append(Problem(f"{root}[{delimiters[1]}]", "a payload declares its reasoning delimiters at most once"))
    if problems:
        raise SpecError(problems)
    return entries


def finish_entries(entries: tuple[Any, ...], *, vocab_size: int | None = None, root: str = WIRE_KEY,
                   limits: SpecLimits = DEFAULT_LIMITS) -> tuple[Any, ...]:
    """The second half: ids against the logits width (when known) and the entries' consistency,
    within ``limits.max_admission_work``."""
    if vocab_size is not None:
        check_vocab(entries, vocab_size, root=root)
    check_consistency(entries, root=root, vocab_size=vocab_size, limits=limits)
    return entries
