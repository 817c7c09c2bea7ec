"""Writing the gated entries into an engine's sampling params."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from dynlogits.specs import WIRE_KEY, encode_entries

__all__ = ["activate_logits_processors"]


def activate_logits_processors(target: Any, entries: Sequence[Any]) -> MutableMapping[str, Any] | None:
    """Set ``extra_args["dynamo_logits"]`` on ``target`` to exactly ``entries``.

    ``target`` is an ``extra_args`` mapping or an object with an ``extra_args``
    attribute (vLLM ``SamplingParams``; ``None`` there becomes a new dict when
    needed). With no entries any ``dynamo_logits`` already present is removed:
    only the gate decides what runs, so a client cannot smuggle a payload in
    through ``vllm_xargs``/``extra_args``. Entries must be wire entries
    (``forced_text`` resolved). Returns the mapping written, or ``None`` when
    ``target`` had no ``extra_args`` and nothing was needed.
    """
    if isinstance(target, MutableMapping):
        extra: MutableMapping[str, Any] | None = target
    else:
        extra = getattr(target, "extra_args", None)
    if not entries:
        if extra is not None:
            extra.pop(WIRE_KEY, None)
        return extra
    payload = encode_entries(entries)
    if extra is None:
        extra = {}
        target.extra_args = extra
    extra[WIRE_KEY] = payload
    return extra
