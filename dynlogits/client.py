"""Client helpers: a per-request payload in the form an engine's own HTTP server carries.

vLLM's OpenAI server (``vllm serve``) types ``vllm_xargs`` values as flat (``str | int | float |
list[scalar]``): the payload crosses it as JSON text, which the adapter parses once and holds to
the operator's ``DYN_LOGITS_REQUEST_KINDS``::

    from openai import OpenAI
    from dynlogits.client import vllm_xargs

    OpenAI(base_url=..., api_key=...).completions.create(
        model=..., prompt="Hi",
        extra_body={"vllm_xargs": vllm_xargs([{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}])})

Entries are checked here with the server's request rules (``SpecError`` naming the field), so a
mistake shows before anything is sent. Imports neither torch nor an engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dynlogits.specs import WIRE_KEY, parse_entries
from dynlogits.specs.wire import request_dump

__all__ = ["payload_text", "vllm_xargs"]


def payload_text(entries: Iterable[Any]) -> str:
    """The JSON text of ``entries`` (spec models or dicts), checked as a request's entries are
    (default limits; ``python`` refused: it is operator-only)."""
    checked = parse_entries([_plain(e) for e in entries], root=WIRE_KEY)
    return json.dumps([request_dump(e) for e in checked], separators=(",", ":"), allow_nan=False)


def vllm_xargs(entries: Iterable[Any]) -> dict[str, str]:
    """``{"dynamo_logits": "<JSON text>"}``, for ``extra_body={"vllm_xargs": ...}`` of a request to
    ``vllm serve`` (merge other ``vllm_xargs`` keys into the returned dict)."""
    return {WIRE_KEY: payload_text(entries)}


def _plain(entry: object) -> object:
    dump = getattr(entry, "model_dump", None)
    return dump(mode="json") if callable(dump) else entry
