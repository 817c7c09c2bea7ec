"""The frontend's check of a client's body (``dynlogits.serve.frontend.validation``): its entries are
parsed once, and what it forwards to the worker is what it validated, which the worker's own parse
reads back as the same entries."""

from __future__ import annotations

from typing import Any

import pytest

from dynlogits.policy.config import parse_config
from dynlogits.serve.frontend import validation
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest
from dynlogits.serve.http.errors import HTTPError
from dynlogits.specs import ENTRY_KINDS, REQUEST_FORBIDDEN_KINDS, parse_entries
from dynlogits.specs.schema import golden_vectors

KINDS = sorted(ENTRY_KINDS - REQUEST_FORBIDDEN_KINDS)  # every kind a request may carry
CONFIG = parse_config({"allow_request_kinds": KINDS})
MESSAGES = [{"role": "user", "content": "hi"}]


def _request_payloads() -> list[tuple[str, list[Any]]]:
    """Every valid golden payload as a client could send it (operator-only kinds left out), and forced_text."""
    payloads = [(name, [e for e in vector["payload"] if e["kind"] not in REQUEST_FORBIDDEN_KINDS])
                for name, vector in golden_vectors() if vector["valid"]]
    return [*payloads, ("forced_text", [{"kind": "forced_text", "text": "Hello world!"}])]


def _validate(**fields: Any) -> tuple[Any, list[str]]:
    return validation.validate_request(ChatCompletionRequest, {"model": "m", "messages": MESSAGES, **fields}, CONFIG)


@pytest.mark.parametrize("payload", [p for _, p in _request_payloads()], ids=[n for n, _ in _request_payloads()])
def test_the_worker_reads_back_exactly_the_entries_the_frontend_validated(payload: list[Any]) -> None:
    body, kinds = _validate(logits_processors=payload)
    validated = parse_entries(payload, limits=CONFIG.limits, allowed_kinds=KINDS)
    assert parse_entries(body.logits_processors, limits=CONFIG.limits, allowed_kinds=KINDS) == validated
    assert kinds == [e.kind for e in validated]


def test_an_integer_bias_is_forwarded_as_the_number_it_was_validated_as() -> None:
    body, _ = _validate(logits_processors=[{"kind": "logit_bias", "bias": {"3": 5}}])
    assert body.logits_processors == [{"kind": "logit_bias", "bias": {"3": 5.0}}]
    assert isinstance(body.logits_processors[0]["bias"]["3"], float)


def test_controls_travel_as_sent_beside_the_clients_own_entries() -> None:
    own = [{"kind": "banned_tokens", "token_ids": [7]}]
    body, kinds = _validate(logits_processors=own, logit_bias={"5": 1}, allowed_token_ids=[5, 6], bad_words=["x"])
    assert body.logits_processors == own
    sent = {name: value for name, value in body.controls().items() if value is not None}
    assert sent == {"logit_bias": {"5": 1}, "allowed_token_ids": [5, 6], "bad_words": ["x"]}
    assert kinds == ["banned_tokens", "logit_bias", "allowed_tokens", "banned_phrases"]


class _CountingParse:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return parse_entries(*args, **kwargs)


@pytest.mark.parametrize("fields, param", [
    ({"logits_processors": [{"kind": "banned_tokens", "token_ids": [7]}], "logit_bias": {"5": 1},
      "allowed_token_ids": [5]}, None),
    ({"logits_processors": {"kind": "banned_tokens", "token_ids": [7]}, "logit_bias": {"5": 1}}, "logits_processors"),
    ({"logits_processors": [{"kind": "banned_tokens", "token_ids": [7]}], "logit_bias": {"5": 1000}},
     'logit_bias["5"]'),
], ids=["valid", "not a list", "bad control"])
def test_a_requests_entries_are_parsed_once(monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any],
                                            param: str | None) -> None:
    parse = _CountingParse()
    monkeypatch.setattr(validation, "parse_entries", parse)
    if param is None:
        _validate(**fields)
    else:
        with pytest.raises(HTTPError) as err:
            _validate(**fields)
        assert err.value.status == 400 and err.value.param == param
    assert parse.calls == 1


def test_a_request_without_entries_or_controls_parses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = _CountingParse()
    monkeypatch.setattr(validation, "parse_entries", parse)
    body, kinds = _validate(logit_bias={})
    assert (body.logits_processors, kinds, parse.calls) == (None, [], 0)
