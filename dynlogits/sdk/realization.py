"""Duty 2, realize: an untrusted payload -> fresh per-request processors, never raising into the engine.

``validate(payload)`` is the admission check (where the engine has one: raise there so a bad
payload fails its own request with a clear error before it is queued). ``realize(...)`` runs
where the request enters the engine's batch; it never raises: a payload that only fails there
(e.g. an id beyond the logits width, which admission may not know) yields a request that is
already failed and is fail-stopped on its first row (see ``dynlogits.sdk.guard``).
"""

from __future__ import annotations

from typing import Any

from dynlogits.realize import build_request_processor, validate_payload

from .guard import FailureReport, GuardedRequest

__all__ = ["realize", "validate"]


def validate(payload: Any, *, vocab_size: int | None = None) -> None:
    """Raise ``SpecError`` (a ``ValueError`` naming the field) unless ``payload`` would realize.

    ``None`` (no payload) is valid. Pass ``vocab_size`` (the logits width) when it is known.
    """
    if payload is not None:
        validate_payload(payload, vocab_size=vocab_size)


def realize(
    payload: Any,
    *,
    vocab_size: int,
    stop_token_id: int | None,
    report: FailureReport | None = None,
) -> GuardedRequest | None:
    """Fresh processors for one request; ``None`` when it carries no payload (or an empty one).

    ``vocab_size`` is the logits width; ``stop_token_id`` ends the request if it fails
    (``dynlogits.sdk.pick_stop_token``); ``report`` receives one line per failure. Never raises.
    """
    if payload is None:
        return None
    try:
        processor = build_request_processor(payload, vocab_size=vocab_size)
    except Exception as exc:
        return GuardedRequest.failed_at_realization(
            f"payload rejected in the engine: {type(exc).__name__}: {exc}", stop_token_id=stop_token_id, report=report
        )
    if processor is None:
        return None
    return GuardedRequest(processor, stop_token_id=stop_token_id, report=report)
