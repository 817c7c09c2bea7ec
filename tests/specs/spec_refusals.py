"""Shared by the admission-consistency tests: the one problem a refused wire payload is named by,
whether one is admitted, whether its realized processors fail while writing a given output, and
the row a brute force derives for an output from the payload's text alone (its oracle)."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.specs import SpecError, decode_wire_payload


def refusal(payload: list[dict[str, Any]]) -> str:
    """``path: rule`` of the single problem ``decode_wire_payload`` refuses ``payload`` with."""
    with pytest.raises(SpecError) as err:
        decode_wire_payload(payload)
    (problem,) = err.value.problems
    return str(problem)


def admitted(payload: list[dict[str, Any]]) -> bool:
    """Whether ``decode_wire_payload`` admits ``payload``."""
    try:
        decode_wire_payload(payload)
    except SpecError:
        return False
    return True


def fails_writing(payload: list[dict[str, Any]], output: list[int], *, vocab_size: int = 64, stop: int = 2) -> bool:
    """Whether the realized processors of ``payload`` (the host path) fail its request while it
    writes ``output`` one token a step; every token written before that must have been allowed.
    Admission's checks are left out of the realization (and out of its memo), so a payload that
    admission refuses is realized too: the processors themselves must fail."""
    from unittest import mock

    import torch

    from dynlogits import sdk
    from dynlogits.processors.kept import Kept
    from dynlogits.sdk import realization

    with mock.patch.object(realization, "finish_entries", lambda entries, **_: entries), \
            mock.patch.object(realization, "_checked_memo", Kept(1, 1 << 30)):
        request = sdk.realize(payload, vocab_size=vocab_size, stop_token_id=stop)
    assert request is not None and not request.failed
    for n, token in enumerate(output):
        row = sdk.apply_row(request, output[:n], torch.zeros(vocab_size))
        if request.failed:
            break
        assert bool(torch.isfinite(row[token])), (n, token)
    return request.failed


def row_left(payload: list[dict[str, Any]], written: tuple[int, ...]) -> tuple[set[int] | None, set[int]]:
    """Brute force of one step, from the rules in docs/specs.md (no code of the specs layer): after
    ``written``, ``(allowed, masked)``, every id but ``masked`` when ``allowed`` is ``None``, for
    entries applied in order with masks kept. Scopes and ``reasoning`` entries are ignored (the
    tests' outputs never open a reasoning span: the whole output is one answer stretch)."""
    n, allowed, masked = len(written), None, set()
    for e in payload:
        kind, keep, mask = e["kind"], None, set()
        if kind == "banned_tokens" or (kind == "min_tokens" and n < e["min_tokens"]):
            mask = set(e["token_ids"] if kind == "banned_tokens" else e["stop_token_ids"])
        elif kind == "banned_phrases":  # each phrase's last token where the output ends with the rest
            mask = {p[-1] for p in e["phrases"] if len(p) - 1 <= n and list(written[n - len(p) + 1:]) == p[:-1]}
        elif kind == "allowed_tokens":
            keep = {*e["token_ids"], e["eos_token_id"]}
        elif kind == "forced_sequence":  # its tokens, then its EOS at every later step
            keep = {e["token_ids"][n] if n < len(e["token_ids"]) else e["eos_token_id"]}
        elif kind == "multiple_choice":  # the next tokens of the choices begun, EOS after a whole one
            choices = [tuple(c) for c in e["choices"]]
            keep = {c[n] for c in choices if len(c) > n and c[:n] == written} | (
                {e["eos_token_id"]} if written in choices else set())
        elif kind == "trigger":  # its phrase, one token a step, after the first time the output ends with it
            cue, phrase = tuple(e["trigger_token_ids"]), e["phrase_token_ids"]
            start = next((k for k in range(len(cue), n + 1) if written[k - len(cue):k] == cue), None)
            if start is not None and n - start < len(phrase):
                keep = {phrase[n - start]}
        if allowed is None:
            masked |= mask
        else:
            allowed -= mask
        if keep is not None:
            allowed = keep - masked if allowed is None else allowed & keep
    return allowed, masked
