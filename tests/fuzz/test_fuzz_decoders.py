"""Fuzzing every in-process reader of untrusted data: the wire decoder, the spec models, the
engine-side admission and realization, and the frontend's body reader and request models.

The only outcomes allowed: success, or the reader's typed error (``SpecError``, ``BodyError``,
a 400 ``HTTPError``) whose problems each name a path under the right root and a rule. Each
property runs a CI sample here and 10,000 cases under ``-m slow`` (``docs/reliability.md``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynlogits.policy.config import DeploymentConfig, parse_config
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest, CompletionRequest
from dynlogits.serve.frontend.validation import validate_request
from dynlogits.serve.http.bodies import BodyError, parse_json_body
from dynlogits.serve.http.errors import HTTPError
from dynlogits.specs import DEFAULT_LIMITS, SpecError, decode_wire_payload, parse_entries, parse_spec

from . import strategies as s

CI = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
VOCAB = 1024
ALLOWED = ("forced_text", "banned_tokens", "logit_bias")
CONFIG = DeploymentConfig(allow_request_kinds=frozenset(ALLOWED))
SPEC_DOCUMENTS = st.one_of(st.fixed_dictionaries({"entries": s.entry_lists}, optional={
    "generation_only": s.odd_values, "allow_request_kinds": s.odd_values, "limits": s.odd_values}), s.odd_values)


def _named(err: SpecError, root: str) -> None:
    for problem in err.problems:
        assert problem.path.startswith(root) and problem.rule, problem


def check_wire(payload: object) -> None:
    """Engine side: admission (``sdk.validate``) is the wire decoder plus the worker's policy, and
    realization (``sdk.realize``) follows admission; only ``SpecError`` is ever raised, and
    realization never raises at all.

    The decoder checks the wire format alone (it runs torch-free, wherever a payload is read);
    admission refuses everything it refuses and, beyond that, only a ``python`` entry whose factory
    the operator did not allow-list on this worker (``DYN_LOGITS_PYTHON_FACTORIES``), named at
    ``dynamo_logits[i].factory``."""
    from dynlogits.sdk import realize, validate

    try:
        decode_wire_payload(payload, vocab_size=VOCAB)
        decoded = True
    except SpecError as err:
        _named(err, "dynamo_logits")
        decoded = False
    try:
        validate(payload, vocab_size=VOCAB)
        admitted = True
    except SpecError as err:
        _named(err, "dynamo_logits")
        admitted = False
        if decoded:  # the policy's refusal only: a python factory off the worker's allow-list
            assert all(p.path.endswith(".factory") and "not allow-listed" in p.rule for p in err.problems), err
    assert admitted <= decoded or payload is None, payload
    request = realize(payload, vocab_size=VOCAB, stop_token_id=0)
    if request is not None and not admitted:
        assert request.failed, payload  # a payload refused at admission never realizes live processors


def check_request_entries(entries: object) -> None:
    """A client's ``logits_processors``: never a ``python`` entry or a kind off the allow-list."""
    try:
        parsed = parse_entries(entries, root="logits_processors", limits=DEFAULT_LIMITS, allowed_kinds=ALLOWED)
    except SpecError as err:
        _named(err, "logits_processors")
        return
    assert all(e.kind in ALLOWED for e in parsed), parsed


def check_spec_and_config(data: object) -> None:
    for parse in (parse_spec, parse_config):
        try:
            parse(data)
        except SpecError as err:
            assert all(p.rule for p in err.problems), err


def check_body(raw: bytes, endpoint: str) -> None:
    """The frontend's reader and models: a body is accepted or refused with a 4xx naming what is wrong."""
    try:
        data = parse_json_body(raw)
        body, kinds = validate_request(ChatCompletionRequest if endpoint == "chat" else CompletionRequest, data, CONFIG)
    except BodyError as err:
        assert err.status in (400, 413) and err.message
        return
    except HTTPError as err:
        assert err.status == 400 and err.message
        assert err.param is not None or err.message == "the request body must be a JSON object", err.message
        return
    assert set(kinds) <= set(ALLOWED)
    assert "dynamo_logits" not in body.client_extra_args()


@CI
@given(st.one_of(s.entry_lists, s.odd_values))
def test_wire_decoder_sample(payload: object) -> None:
    check_wire(payload)


@CI
@given(s.entry_lists)
def test_request_entries_sample(entries: object) -> None:
    check_request_entries(entries)


@CI
@given(SPEC_DOCUMENTS)
def test_spec_and_config_sample(data: object) -> None:
    check_spec_and_config(data)


@CI
@given(st.sampled_from(["chat", "completion"]).flatmap(lambda e: st.tuples(st.just(e), s.raw_bodies(e))))
def test_request_body_sample(case: tuple[str, bytes]) -> None:
    check_body(case[1], case[0])


@pytest.mark.slow
@SLOW
@given(st.one_of(s.entry_lists, s.odd_values))
def test_wire_decoder_10k(payload: object) -> None:
    check_wire(payload)


@pytest.mark.slow
@SLOW
@given(s.entry_lists)
def test_request_entries_10k(entries: object) -> None:
    check_request_entries(entries)


@pytest.mark.slow
@SLOW
@given(st.sampled_from(["chat", "completion"]).flatmap(lambda e: st.tuples(st.just(e), s.raw_bodies(e))))
def test_request_body_10k(case: tuple[str, bytes]) -> None:
    check_body(case[1], case[0])


@pytest.mark.slow
@SLOW
@given(SPEC_DOCUMENTS)
def test_spec_and_config_10k(data: object) -> None:
    check_spec_and_config(data)
