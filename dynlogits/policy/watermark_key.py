"""The operator's watermark key: where the logits config reads it from, and who may touch it.

A ``watermark`` entry in the operator's config (``dynlogits.policy.config``) gives its key one way:

```yaml
entries:
  - {kind: watermark, scheme: gumbel, context_width: 4, key: 1234}              # inline
  - {kind: watermark, scheme: gumbel, context_width: 4, key_env: WATERMARK_KEY} # from the environment
  - {kind: watermark, scheme: gumbel, context_width: 4, key_file: wm.key}       # from a file
```

:func:`resolve_key_sources` turns ``key_env`` / ``key_file`` into ``key`` when the config is loaded
(start-up), before the entry is validated as a ``watermark`` entry, so everything after start-up sees
the inline form. ``key_file`` is read like the project's other secret files (its first line that is
not blank or a ``#`` comment; a relative path is taken from the config file's folder). The key is a
decimal integer from 0 to 2**64-1. A missing variable or file, or a value that is not such an
integer, is refused naming the entry's field (``entries[0].key_env``) and never quoting the value.

Only the operator's config resolves these fields: a client's entry goes through the spec model
alone, which has no ``key_env`` / ``key_file``, so a request can never read the servers' environment
or files. A client's own ``watermark`` entry is refused where the operator's config has one
(:func:`watermark_problem`): the operator's watermark can be neither removed nor replaced. The
watermark draws the sampled token from the row every other entry leaves, so it must be the payload's
last entry (its admission rule): the operator's is moved after a client's entries
(:func:`deployment_watermark_last`).

The key is never written anywhere a caller can read: :class:`OperatorWatermark` (what detection
needs) keeps it out of its repr, and no message here quotes it. Torch-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynlogits.specs import Problem
from dynlogits.specs.entry_base import EntryLike, field_of

__all__ = ["KEY_SOURCES", "MAX_KEY", "WATERMARK_KIND", "OperatorWatermark", "deployment_watermark_last",
           "has_watermark", "operator_watermark", "resolve_key_sources", "watermark_problem"]

#: The kind whose key this module resolves (W1's ``specs/builtin/watermark.py`` declares it).
WATERMARK_KIND = "watermark"
#: The fields an operator's watermark entry may give its key with: exactly one of them.
KEY_SOURCES = ("key", "key_env", "key_file")
#: The largest key: the watermark's PRF takes a 64-bit key.
MAX_KEY = 2**64 - 1

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class OperatorWatermark:
    """The operator's watermark as detection needs it. ``key`` is the secret: out of the repr."""

    key: int = field(repr=False)
    context_width: int
    #: where it is in the operator's entries (``entries[i]``)
    path: str


def _is_watermark(entry: object) -> bool:
    return isinstance(entry, Mapping) and entry.get("kind") == WATERMARK_KIND


def _parse_key(text: str) -> int | None:
    """``text`` as a key (a decimal integer 0..2**64-1, surrounding blanks ignored), else ``None``."""
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > len(str(MAX_KEY)):
        return None
    value = int(text)
    return value if value <= MAX_KEY else None


_KEY_RULE = f"must hold the watermark key: a decimal integer from 0 to {MAX_KEY}"


def _key_from_env(name: Any, path: str, environ: Mapping[str, str]) -> tuple[int | None, Problem | None]:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        return None, Problem(path, "must be the name of an environment variable (letters, digits and '_', "
                                   "not starting with a digit)")
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None, Problem(path, f"the environment variable {name} is not set (or empty) in this process: it "
                                   "must hold the watermark key")
    key = _parse_key(raw)
    if key is None:
        return None, Problem(path, f"the environment variable {name} {_KEY_RULE} (its value is not quoted)")
    return key, None


def _key_from_file(name: Any, path: str, base_dir: Path | None) -> tuple[int | None, Problem | None]:
    if not isinstance(name, str) or not name.strip():
        return None, Problem(path, "must be the path of a file holding the watermark key")
    file = Path(name)
    if not file.is_absolute() and base_dir is not None:
        file = base_dir / file
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return None, Problem(path, f"{str(file)!r} cannot be read ({type(err).__name__}): it must hold the watermark key")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    key = _parse_key(lines[0]) if lines else None
    if key is None:
        return None, Problem(path, f"{str(file)!r}: its first line that is not blank or a '#' comment {_KEY_RULE} "
                                   "(its content is not quoted)")
    return key, None


def resolve_key_sources(entries: Any, *, root: str = "entries", environ: Mapping[str, str] | None = None,
                        base_dir: Path | None = None) -> tuple[Any, list[Problem]]:
    """The operator's ``entries`` (as loaded, before validation) with each ``watermark`` entry's
    ``key_env`` / ``key_file`` read into ``key``, and the problems found (paths ``root[i].key_env``
    ...). Anything that is not a list of entries is returned as it is, for validation to name.

    ``environ`` defaults to the process's environment; ``base_dir`` is where a relative ``key_file``
    is found (the config file's folder; ``None``: the working directory)."""
    if not isinstance(entries, list):
        return entries, []
    env = os.environ if environ is None else environ
    out: list[Any] = []
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        if not _is_watermark(entry):
            out.append(entry)
            continue
        given = [name for name in KEY_SOURCES if name in entry]
        where = f"{root}[{i}]"
        if len(given) > 1:
            problems.append(Problem(f"{where}.{given[1]}", f"give the watermark key one way: {' or '.join(KEY_SOURCES)}, "
                                                           f"not {' and '.join(given)}"))
            out.append(entry)
            continue
        if not given:
            problems.append(Problem(f"{where}.key", f"the operator's watermark needs its key: give key (an integer "
                                                    f"0..{MAX_KEY}), key_env (an environment variable's name) or "
                                                    "key_file (a file's path)"))
            out.append(entry)
            continue
        source = given[0]
        if source == "key":
            out.append(entry)
            continue
        if source == "key_env":
            key, problem = _key_from_env(entry[source], f"{where}.key_env", env)
        else:
            key, problem = _key_from_file(entry[source], f"{where}.key_file", base_dir)
        if problem is not None:
            problems.append(problem)
            out.append(entry)
            continue
        out.append({**{k: v for k, v in entry.items() if k != source}, "key": key})
    return out, problems


def operator_watermark(entries: Sequence[EntryLike]) -> OperatorWatermark | None:
    """The first ``watermark`` among the operator's (validated) ``entries``, or ``None``."""
    for i, entry in enumerate(entries):
        if field_of(entry, "kind") == WATERMARK_KIND:
            return OperatorWatermark(key=int(field_of(entry, "key")), context_width=int(field_of(entry, "context_width")),
                                     path=f"entries[{i}]")
    return None


def has_watermark(entries: Sequence[EntryLike]) -> bool:
    """Whether the operator's ``entries`` hold a ``watermark``."""
    return any(field_of(e, "kind") == WATERMARK_KIND for e in entries)


def watermark_problem(own: Sequence[EntryLike], deployment: Sequence[EntryLike], *, root: str,
                      deployment_paths: Sequence[str] | None = None) -> Problem | None:
    """The client's own ``watermark`` entry (named at ``root[j]``) where the deployment has one: the
    operator's watermark can be neither removed nor replaced, and a second one beside it would
    replace its draw, so the request is refused naming both. ``None`` otherwise."""
    j = next((j for j, e in enumerate(own) if field_of(e, "kind") == WATERMARK_KIND), None)
    if j is None:
        return None
    i = next((i for i, e in enumerate(deployment) if field_of(e, "kind") == WATERMARK_KIND), None)
    if i is None:
        return None
    path = deployment_paths[i] if deployment_paths is not None else f"deployment entries[{i}]"
    return Problem(f"{root}[{j}]", f"a request's watermark entry beside the deployment's watermark ({path}): the "
                                   "deployment's watermark can be neither removed nor replaced; send the request "
                                   "without this entry (the deployment's watermark applies to it)")


def deployment_watermark_last(entries: Sequence[Any], paths: Sequence[str], *,
                              deployment: int) -> tuple[list[Any], list[str]]:
    """``entries`` (the deployment's ``deployment`` first, then the client's) with the deployment's
    ``watermark`` moved after the client's entries, and ``paths`` alike: it draws from the row every
    other entry leaves, so it is the payload's last. Unchanged without one."""
    i = next((i for i, e in enumerate(entries[:deployment]) if field_of(e, "kind") == WATERMARK_KIND), None)
    if i is None or deployment == len(entries):
        return list(entries), list(paths)
    return ([*entries[:i], *entries[i + 1:], entries[i]], [*paths[:i], *paths[i + 1:], paths[i]])
