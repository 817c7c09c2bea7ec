"""OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids`` / ``bad_words``, mapped onto dynlogits kinds.

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

__all__ = ["CONTROL_FIELDS", "Controls", "rename_control_paths", "with_controls"]

#: Request field -> the kind it maps onto.
CONTROL_FIELDS: dict[str, str] = {"logit_bias": "logit_bias", "allowed_token_ids": "allowed_tokens",
                                  "bad_words": "banned_phrases"}
#: The entry field each control's value becomes (its sub-paths keep their shape under the control's name).
_VALUE_FIELD = {"logit_bias": ".bias", "allowed_token_ids": ".token_ids", "bad_words": ".texts"}
ROOT = "logits_processors"


@dataclass(frozen=True)
class Controls:
    """A request's raw entries: its own ``logits_processors``, then one per control field set.

    ``origins[i]`` is the control field entry ``i`` came from (``None``: the client's own entry)."""

    entries: list[Any] = field(default_factory=list)
    origins: list[str | None] = field(default_factory=list)


def _is_set(name: str, value: Any) -> bool:
    """``logit_bias: {}`` and ``bad_words: []`` ask for nothing; ``allowed_token_ids: []`` would allow
    nothing, which the kind refuses (as vLLM does)."""
    return value is not None and (name == "allowed_token_ids" or (value != {} and value != []))


def _bad_words(value: Any, config: DeploymentConfig) -> dict[str, Any]:
    """The ``banned_phrases`` entry of ``bad_words`` (a list of non-blank strings, as vLLM requires:
    a blank word tokenizes to nothing), checked against the spec limits before any tokenizing."""
    if not isinstance(value, list):
        raise SpecError.single("bad_words", "must be a list of strings")
    limits = config.limits
    if len(value) > limits.max_phrases:
        raise SpecError.single("bad_words", f"must have at most {limits.max_phrases} items (limit max_phrases)")
    for i, word in enumerate(value):
        if not isinstance(word, str) or not word.strip():
            raise SpecError.single(f"bad_words[{i}]", "must be a non-blank string")
        if len(word) > limits.max_text_chars:
            raise SpecError.single(f"bad_words[{i}]", f"must have at most {limits.max_text_chars} characters "
                                                      "(limit max_text_chars)")
    return {"kind": "banned_phrases", "texts": value}


def with_controls(own: list[Any] | None, fields: Mapping[str, Any], config: DeploymentConfig) -> Controls:
    """The client's entries ``own`` plus one raw entry per control field set in ``fields``.

    Raises ``SpecError`` naming the field when its kind is not allowed, or for ``bad_words`` a value
    of the wrong shape or over the spec limits. The entries themselves are validated by the caller
    (``parse_entries`` / the worker's policy, which resolves the words with its tokenizer); pass its
    ``SpecError`` through :func:`rename_control_paths`."""
    entries = list(own or [])
    origins: list[str | None] = [None] * len(entries)
    for name, kind in CONTROL_FIELDS.items():
        value = fields.get(name)
        if not _is_set(name, value):
            continue
        if kind not in config.allow_request_kinds:
            raise SpecError.single(name, f"maps onto the {kind!r} kind, which this deployment does not allow "
                                         f"(allow_request_kinds: {sorted(config.allow_request_kinds)})")
        if name == "logit_bias":
            entry: dict[str, Any] = {"kind": kind, "bias": value}
        elif name == "allowed_token_ids":
            entry = {"kind": kind, "token_ids": value}
        else:
            entry = _bad_words(value, config)
        entries.append(entry)
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
        value = _VALUE_FIELD.get(origin)
        return origin + tail[len(value):] if value is not None and tail.startswith(value) else origin

    renamed = [Problem(_ENTRY_PATH.sub(rename, p.path), _ENTRY_PATH.sub(rename, p.rule)) for p in err.problems]
    return SpecError(list(dict.fromkeys(renamed)))  # problems that became the same (a word's two variants): once
