"""The request's control fields (OpenAI's ``logit_bias``, vLLM's ``allowed_token_ids`` / ``bad_words``),
mapped onto dynlogits kinds as the table ``dynlogits.serve.control_fields.CONTROLS`` says.

:func:`with_controls` appends one raw entry per field set to the client's own entries, so each
passes the same checks (allow-list, spec limits, vocabulary, consistency): ``logit_bias`` ->
``logit_bias``, ``allowed_token_ids`` -> ``allowed_tokens`` without an EOS id, ``bad_words`` ->
``banned_phrases`` ``texts`` (the worker resolves them as vLLM resolves ``bad_words``). ``{}`` and
``[]`` ask for nothing (``allowed_token_ids: []`` is refused). :func:`rename_control_paths` names the
field in an error, never a path inside ``logits_processors``. The table: ``docs/deployment.md``.
Imports neither torch nor an engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynlogits.policy.config import DeploymentConfig
from dynlogits.specs import Problem, SpecError

from .control_fields import CONTROLS, ControlField

__all__ = ["ROOT", "Controls", "rename_control_paths", "with_controls"]

#: Where a request's own entries are (``logits_processors[i]``), in the paths of errors.
ROOT = "logits_processors"
#: Request field -> the row of the control table it is.
_BY_NAME: dict[str, ControlField] = {c.name: c for c in CONTROLS}
#: Request field -> the fields whose values join its entry (``dry_multiplier``: the other ``dry_*``).
_JOINING: dict[str, tuple[ControlField, ...]] = {c.name: tuple(j for j in CONTROLS if j.joins == c.name) for c in CONTROLS}


@dataclass(frozen=True)
class Controls:
    """A request's raw entries: its own ``logits_processors``, then one per control field set.

    ``origins[i]`` is the control field entry ``i`` came from (``None``: the client's own entry)."""

    entries: list[Any] = field(default_factory=list)
    origins: list[str | None] = field(default_factory=list)


def _is_set(control: ControlField, value: Any) -> bool:
    """``logit_bias: {}`` and ``bad_words: []`` ask for nothing; ``allowed_token_ids: []`` would allow
    nothing, which the kind refuses (as vLLM does); ``dry_multiplier: 0`` is DRY off."""
    if control.zero_is_off and not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0:
        return False
    return value is not None and (not control.empty_asks_nothing or (value != {} and value != []))


def _check_words(name: str, value: Any, config: DeploymentConfig) -> None:
    """A words field (``bad_words``) is a list of non-blank strings, as vLLM requires (a blank word
    tokenizes to nothing), within the spec limits; ``SpecError`` naming it, before any tokenizing."""
    if not isinstance(value, list):
        raise SpecError.single(name, "must be a list of strings")
    limits = config.limits
    if len(value) > limits.max_phrases:
        raise SpecError.single(name, f"must have at most {limits.max_phrases} items (limit max_phrases)")
    for i, word in enumerate(value):
        if not isinstance(word, str) or not word.strip():
            raise SpecError.single(f"{name}[{i}]", "must be a non-blank string")
        if len(word) > limits.max_text_chars:
            raise SpecError.single(f"{name}[{i}]", f"must have at most {limits.max_text_chars} characters "
                                                   "(limit max_text_chars)")


def with_controls(own: list[Any] | None, fields: Mapping[str, Any], config: DeploymentConfig) -> Controls:
    """The client's entries ``own`` plus one raw entry per control field set in ``fields``.

    Raises ``SpecError`` naming the field when its kind is not allowed, or for ``bad_words`` a value
    of the wrong shape or over the spec limits. The entries themselves are validated by the caller
    (``parse_entries`` / the worker's policy, which resolves the words with its tokenizer); pass its
    ``SpecError`` through :func:`rename_control_paths`."""
    entries = list(own or [])
    origins: list[str | None] = [None] * len(entries)
    made: dict[str, dict[str, Any]] = {}  # request field -> the entry it made (for the fields that join it)
    for control in CONTROLS:
        name, kind, value = control.name, control.kind, fields.get(control.name)
        if not _is_set(control, value):
            continue
        if control.joins is not None:  # a field of another field's entry: nothing without that one
            if control.joins in made:
                made[control.joins][control.value_field] = value
            continue
        if kind not in config.allow_request_kinds:
            raise SpecError.single(name, f"maps onto the {kind!r} kind, which this deployment does not allow "
                                         f"(allow_request_kinds: {sorted(config.allow_request_kinds)})")
        if control.words:
            _check_words(name, value, config)
        entries.append(made.setdefault(name, {"kind": kind, control.value_field: value}))
        origins.append(name)
    return Controls(entries=entries, origins=origins)


#: ``logits_processors[3]`` and the sub-path after it (``.bias["42"]``, ``.token_ids[1]``, ``.kind``).
_ENTRY_PATH = re.compile(re.escape(ROOT) + r'\[(\d+)\]((?:\.[A-Za-z_]+|\[\d+\]|\["(?:[^"\\]|\\.)*"\])*)')


def rename_control_paths(err: SpecError, origins: Sequence[str | None]) -> SpecError:
    """``err`` with every path into an entry that came from a control field renamed to that field:
    ``logits_processors[2].bias["42"]`` -> ``logit_bias["42"]``, ``logits_processors[3].token_ids[1]``
    -> ``allowed_token_ids[1]``, ``logits_processors[4].texts[2]`` -> ``bad_words[2]`` (anything else
    in a ``bad_words`` entry, e.g. its resolved ``phrases``, -> ``bad_words``)."""
    if not any(o is not None for o in origins):
        return err

    def rename(match: re.Match[str]) -> str:
        index, tail = int(match.group(1)), match.group(2)
        origin = origins[index] if index < len(origins) else None
        if origin is None:
            return match.group(0)
        control = _BY_NAME.get(origin)
        for row in (control, *_JOINING.get(origin, ())) if control is not None else ():
            value = f".{row.value_field}"
            if tail == value or tail.startswith((value + ".", value + "[")):
                return row.name + tail[len(value):]
        return origin

    renamed = [Problem(_ENTRY_PATH.sub(rename, p.path), _ENTRY_PATH.sub(rename, p.rule)) for p in err.problems]
    return SpecError(list(dict.fromkeys(renamed)))  # problems that became the same (a word's two variants): once
