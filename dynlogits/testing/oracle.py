"""What ``docs/specs.md`` says each built-in kind does to one row, written independently of the
processors (plain Python over lists), so the kit can tell a wrong adapter from a right one.

``expected_row(entries, history, row, request=...)`` returns the row after every entry, in payload
order; ``OracleRequest`` holds what entries may read besides the history (the prompt, the stop ids,
the arrival and the time now). ``python`` entries are only understood for the kit's own ``scale``
factory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .dry_reference import dry_penalties
from .faults import SCALE_FACTORY
from .watermark_reference import watermark_token

__all__ = ["OracleRequest", "expected_row"]

NEG = -math.inf


@dataclass(frozen=True)
class OracleRequest:
    """What an entry may read besides the history: the prompt, the request's stop ids (the first
    is the one forced), when it arrived and the time of the step."""

    prompt: Sequence[int] = ()
    stop_token_ids: Sequence[int] = ()
    arrival: float = 0.0
    now: float = 0.0
    #: each token id's text (``dry``'s breakers), ``None``: no tokenizer
    vocabulary: Sequence[str] | None = None
    #: the request's temperature as its engine samples it (``watermark``; ``None`` or 0: greedy)
    temperature: float | None = None


def _force(row: list[float], token: int) -> None:
    for i in range(len(row)):
        row[i] = NEG
    row[token] = 0.0


def _ends_with(ids: Sequence[int], upto: int, seq: Sequence[int]) -> bool:
    return upto >= len(seq) and list(ids[upto - len(seq) : upto]) == list(seq)


def _thinking(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
    # spans over the prompt and the output together: a span the prompt left open counts its tokens
    start, end, budget = e["start_token_ids"], e["end_token_ids"], e["budget"]
    ids = [*request.prompt, *h]
    opened: int | None = None  # index of the first token inside the open span
    for upto in range(1, len(ids) + 1):
        if opened is None:
            if _ends_with(ids, upto, start):
                opened = upto
        elif upto - opened >= len(end) and _ends_with(ids, upto, end):
            opened = None
    if opened is None or len(ids) - opened < budget:
        return
    span = len(ids) - opened
    done = 0  # leading end tokens already written at the end of the span
    for k in range(min(len(end) - 1, span), 0, -1):
        if list(ids[len(ids) - k :]) == list(end[:k]):
            done = k
            break
    _force(row, end[done])


def _spans(ids: Sequence[int], start: Sequence[int], end: Sequence[int]) -> list[tuple[int | None, int]]:
    """After each prefix of ``ids``: where the open span began (``None``: none) and where the
    stretch outside spans began (the reasoning rule of docs/specs.md, scanned from scratch)."""
    out: list[tuple[int | None, int]] = [(None, 0)]
    opened, outside = None, 0
    for upto in range(1, len(ids) + 1):
        if opened is None:
            if _ends_with(ids, upto, start):
                opened = upto
        elif upto - opened >= len(end) and _ends_with(ids, upto, end):
            opened, outside = None, upto
        out.append((opened, outside))
    return out


def _phase(entries: Sequence[Mapping[str, Any]], h: Sequence[int], request: OracleRequest) -> tuple[str, int]:
    """The phase of the step after ``h`` and where its stretch began (generated positions, >= 0)."""
    reasoning = next((e for e in entries if e["kind"] == "reasoning"), None)
    if reasoning is None:
        return "answer", 0
    p = len(request.prompt)
    opened, outside = _spans([*request.prompt, *h], reasoning["start_token_ids"], reasoning["end_token_ids"])[-1]
    if opened is not None:
        return "reasoning", max(0, opened - p)
    return "answer", max(0, outside - p)


def _apply(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
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
        _thinking(row, e, h, request)
    elif kind == "banned_phrases":
        _banned_phrases(row, e, h)
    elif kind == "multiple_choice":
        _multiple_choice(row, e, h, request)
    elif kind == "trigger":
        _trigger(row, e, h)
    elif kind == "deadline":
        _deadline(row, e, request)
    elif kind == "prompt_tokens":
        _prompt_tokens(row, e, request)
    elif kind == "dry":
        _dry(row, e, h, request)
    elif kind == "no_repeat_ngram":
        _no_repeat_ngram(row, e, h, request)
    elif kind == "watermark":
        _watermark(row, e, h, request)
    elif kind == "python" and e["factory"] == SCALE_FACTORY:
        factor = float(e.get("kwargs", {}).get("scale", 2.0))
        for i in range(len(row)):
            row[i] *= factor
    else:
        raise ValueError(f"the oracle does not know entry {e!r}")


def _banned_phrases(row: list[float], e: Mapping[str, Any], h: Sequence[int]) -> None:
    # every phrase, every step: its last token goes when the output ends with the tokens before it
    # (a one-token phrase: always); nothing else changes
    for phrase in e["phrases"]:
        *before, last = phrase
        if not before or _ends_with(h, len(h), before):
            row[last] = NEG


def _stop(row: list[float], request: OracleRequest) -> int | None:
    """The request's stop token: its first stop id inside the row (``None``: none)."""
    return next((t for t in request.stop_token_ids if 0 <= t < len(row)), None)


def _multiple_choice(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
    # keep the next token of every choice the output is a proper prefix of; EOS once the output is a
    # whole choice, and again once EOS has followed a whole choice; everything else goes
    eos = e["eos_token_id"] if e.get("eos_token_id") is not None else _stop(row, request)
    out, keep = list(h), set()
    for choice in map(list, e["choices"]):
        if len(out) < len(choice) and choice[: len(out)] == out:
            keep.add(choice[len(out)])
        elif out == choice or (len(out) > len(choice) and out[: len(choice)] == choice and out[len(choice)] == eos):
            keep.add(eos)
    for i in range(len(row)):
        if i not in keep:
            row[i] = NEG


def _trigger(row: list[float], e: Mapping[str, Any], h: Sequence[int]) -> None:
    # the first position the output ends with the trigger; the phrase's tokens in the steps after it
    trigger, phrase = list(e["trigger_token_ids"]), list(e["phrase_token_ids"])
    first = next((end for end in range(len(trigger), len(h) + 1) if list(h[end - len(trigger) : end]) == trigger), None)
    if first is not None and len(h) - first < len(phrase):
        _force(row, phrase[len(h) - first])


def _deadline(row: list[float], e: Mapping[str, Any], request: OracleRequest) -> None:
    # from arrival + seconds on, the stop token and nothing else
    stop = _stop(row, request)
    if stop is not None and request.now >= request.arrival + float(e["seconds"]):
        _force(row, stop)


def _prompt_tokens(row: list[float], e: Mapping[str, Any], request: OracleRequest) -> None:
    # each distinct prompt id once: boosted, or (restrict) kept with the stop ids while the rest goes
    prompt = {t for t in request.prompt if 0 <= t < len(row)}
    if e["mode"] == "boost":
        for t in prompt:
            row[t] += float(e.get("boost", 2.0))
        return
    keep = prompt | {t for t in request.stop_token_ids if 0 <= t < len(row)}
    for i in range(len(row)):
        if i not in keep:
            row[i] = NEG


def _no_repeat_ngram(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
    # every n-gram of the history (prompt first with include_prompt) whose first size - 1 tokens are
    # the history's last size - 1: its last token goes; an n-gram holding a placeholder (< 0) counts not
    size = e["size"]
    seq = [*request.prompt, *h] if e.get("include_prompt") else list(h)
    tail = seq[len(seq) - size + 1:] if size > 1 else []
    if len(seq) < size - 1 or any(t < 0 for t in tail):
        return
    for start in range(len(seq) - size + 1):
        gram = seq[start : start + size]
        if gram[:-1] == tail and min(gram) >= 0 and gram[-1] < len(row):
            row[gram[-1]] = NEG


def _dry(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
    # llama.cpp's DRY over the prompt (scope always, include_prompt) and the history: dry_reference
    prompt = request.prompt if e.get("include_prompt", True) and e.get("scope", "always") == "always" else ()
    for token, penalty in dry_penalties(e, [*prompt, *h], request.vocabulary).items():
        if token < len(row) and math.isfinite(row[token]):
            row[token] -= penalty


def _watermark(row: list[float], e: Mapping[str, Any], h: Sequence[int], request: OracleRequest) -> None:
    # the Gumbel-max draw of vLLM's Philox watermark at the request's temperature, forced (watermark_reference)
    token = watermark_token(row, key=e["key"], context_width=e.get("context_width", 4), history=h,
                            temperature=request.temperature)
    if token is not None:
        kept = row[token]
        _force(row, token)
        row[token] = kept if kept == NEG else 0.0


def expected_row(entries: Sequence[Mapping[str, Any]], history: Sequence[int], row: Sequence[float],
                 request: OracleRequest | None = None) -> list[float]:
    """``row`` after applying ``entries`` (wire dicts) at the position ``len(history)``: an entry
    with a ``scope`` acts only in that phase and sees the history since its stretch began."""
    request = request or OracleRequest()
    out = [float(v) for v in row]
    reasoning = next((e for e in entries if e["kind"] == "reasoning"), None)
    for entry in entries:
        if entry["kind"] == "reasoning":
            continue
        if entry["kind"] == "thinking_budget" and reasoning is not None:  # its delimiters, else the request's
            entry = {"start_token_ids": reasoning["start_token_ids"], "end_token_ids": reasoning["end_token_ids"],
                     **{k: v for k, v in entry.items() if v is not None}}
        scope = entry.get("scope", "always")
        if scope == "always":
            _apply(out, entry, history, request)
            continue
        phase, began = _phase(entries, history, request)
        if phase == scope:
            _apply(out, entry, history[began:], request)
    return out
