"""The prompt bound: a request whose entries read its prompt has at most ``limits.max_prompt_tokens``
prompt tokens. Which kinds read it is declared with each kind (``ProcessorKind.reads_prompt``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .builtin import DECLARED
from .entry_like import EntryLike
from .errors import Problem
from .limits import SpecLimits

__all__ = ["PROMPT_BOUND_KINDS", "prompt_limit_problem"]

#: The kinds whose processor reads the request's prompt.
PROMPT_BOUND_KINDS: frozenset[str] = frozenset(k.kind for k in DECLARED if k.reads_prompt)


def _kind(entry: EntryLike) -> object:
    return entry.get("kind") if isinstance(entry, Mapping) else getattr(entry, "kind", None)


def prompt_limit_problem(entries: Sequence[EntryLike], prompt_length: int, limits: SpecLimits, *, path: str,
                         paths: Sequence[str]) -> Problem | None:
    """The problem (at ``path``, the request's prompt) when a prompt of ``prompt_length`` tokens is
    longer than ``limits.max_prompt_tokens`` and an entry (named by ``paths[i]``) reads it."""
    if prompt_length <= limits.max_prompt_tokens:
        return None
    reader = next((i for i, e in enumerate(entries) if _kind(e) in PROMPT_BOUND_KINDS), None)
    if reader is None:
        return None
    return Problem(path, f"is {prompt_length} tokens; {paths[reader]} ({_kind(entries[reader])}) reads at most "
                         f"{limits.max_prompt_tokens} (limit max_prompt_tokens)")
