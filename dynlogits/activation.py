"""Writing the gated entries into an engine's sampling params (vLLM ``extra_args`` shape)."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from dynlogits.sdk.activation import put_payload

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
    extra: MutableMapping[str, Any] | None
    extra = target if isinstance(target, MutableMapping) else getattr(target, "extra_args", None)
    if extra is None:
        if not entries:
            return None
        extra = {}
        target.extra_args = extra
    put_payload(extra, entries)
    return extra
