"""What ``docs/specs.md`` says each built-in kind does to one row, written independently of the
processors (plain Python over lists), so the kit can tell a wrong adapter from a right one.

``expected_row(entries, history, row)`` returns the row after every entry, in payload order.
``python`` entries are only understood for the kit's own ``scale`` factory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .faults import SCALE_FACTORY

__all__ = ["expected_row"]

NEG = -math.inf


def _force(row: list[float], token: int) -> None:
    for i in range(len(row)):
        row[i] = NEG
    row[token] = 0.0


def _ends_with(ids: Sequence[int], upto: int, seq: Sequence[int]) -> bool:
    return upto >= len(seq) and list(ids[upto - len(seq) : upto]) == list(seq)


def _thinking(row: list[float], e: Mapping[str, Any], h: Sequence[int]) -> None:
    start, end, budget = e["start_token_ids"], e["end_token_ids"], e["budget"]
    opened: int | None = None  # index of the first token inside the open span
    for upto in range(1, len(h) + 1):
        if opened is None:
            if _ends_with(h, upto, start):
                opened = upto
        elif upto - opened >= len(end) and _ends_with(h, upto, end):
            opened = None
    if opened is None or len(h) - opened < budget:
        return
    span = len(h) - opened
    done = 0  # leading end tokens already written at the end of the span
    for k in range(min(len(end) - 1, span), 0, -1):
        if list(h[len(h) - k :]) == list(end[:k]):
            done = k
            break
    _force(row, end[done])


def _apply(row: list[float], e: Mapping[str, Any], h: Sequence[int]) -> None:
    kind, n = e["kind"], len(h)
    if kind == "forced_sequence":
        ids = e["token_ids"]
        _force(row, ids[n] if n < len(ids) else e["eos_token_id"])
    elif kind == "banned_tokens":
        for t in e["token_ids"]:
            row[t] = NEG
    elif kind == "allowed_tokens":
        keep = set(e["token_ids"]) | ({e["eos_token_id"]} if e.get("eos_token_id") is not None else set())
        for i in range(len(row)):
            if i not in keep:
                row[i] = NEG
    elif kind == "logit_bias":
        for key, value in e["bias"].items():
            row[int(key)] += float(value)
    elif kind == "min_tokens":
        if n < e["min_tokens"]:
            for t in e["stop_token_ids"]:
                row[t] = NEG
    elif kind == "thinking_budget":
        _thinking(row, e, h)
    elif kind == "python" and e["factory"] == SCALE_FACTORY:
        factor = float(e.get("kwargs", {}).get("scale", 2.0))
        for i in range(len(row)):
            row[i] *= factor
    else:
        raise ValueError(f"the oracle does not know entry {e!r}")


def expected_row(entries: Sequence[Mapping[str, Any]], history: Sequence[int], row: Sequence[float]) -> list[float]:
    """``row`` after applying ``entries`` (wire dicts) at the position ``len(history)``."""
    out = [float(v) for v in row]
    for entry in entries:
        _apply(out, entry, history)
    return out
