"""Realization of a payload the engine already admitted (``RequestFacts.admitted``: vLLM ran
``validate_params`` where the request entered) runs only O(payload) checks, never the consistency
walks again; any other payload is checked in full where it is realized."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits import sdk
from dynlogits.specs import wire

# forced token 5 where the ban masks 5: admission refuses it; fresh ids per test so no memo answers
CONTRADICTION: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": [5]},
                                       {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 0}]


def _payload(salt: int) -> list[dict[str, Any]]:
    return [*CONTRADICTION, {"kind": "logit_bias", "bias": {str(100 + salt): 1.0}}]


def test_an_admitted_payload_is_realized_without_the_consistency_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the consistency walks ran again for an admitted payload")

    monkeypatch.setattr(wire, "check_consistency", walked)
    request = sdk.realize(_payload(1), vocab_size=1000, stop_token_id=0, facts=sdk.RequestFacts(admitted=True))
    assert request is not None and request.error is None


def test_an_admitted_payload_still_has_its_ids_checked_against_the_width() -> None:
    payload = [{"kind": "banned_tokens", "token_ids": [1500]}]
    request = sdk.realize(payload, vocab_size=1000, stop_token_id=0, facts=sdk.RequestFacts(admitted=True))
    assert request is not None and request.error is not None and "vocab size 1000" in request.error


def test_a_payload_not_admitted_is_checked_for_contradictions_where_it_is_realized() -> None:
    request = sdk.realize(_payload(2), vocab_size=1000, stop_token_id=0, facts=sdk.RequestFacts())
    assert request is not None and request.error is not None and "contradicts" in request.error
