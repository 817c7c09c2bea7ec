"""The control table (``dynlogits.serve.control_fields.CONTROLS``) is the one declaration of the request
fields that become kinds: the frontend's body and the worker's request carry exactly its fields, the
frontend forwards each as sent, and each maps onto the kind the table names, its errors renamed to it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from dynlogits.policy.config import parse_config
from dynlogits.serve import control_fields
from dynlogits.serve.control_fields import CONTROL_FIELDS, CONTROLS, ClientControls, ForwardedControls
from dynlogits.serve.frontend.openai_models import ChatCompletionRequest
from dynlogits.serve.openai_controls import with_controls
from dynlogits.serve.protocol import GenerateRequest

VALUES = {"logit_bias": {"5": 1.0}, "allowed_token_ids": [5, 6], "bad_words": ["x"], "no_repeat_ngram_size": 2,
          "dry_multiplier": 0.8, "dry_base": 1.5, "dry_allowed_length": 3, "dry_sequence_breakers": ["\n"],
          "dry_penalty_last_n": 64}


def test_the_table_names_each_field_once() -> None:
    assert len(CONTROL_FIELDS) == len(CONTROLS) and set(VALUES) == set(CONTROL_FIELDS)


@pytest.mark.parametrize("model", [ClientControls, ForwardedControls, ChatCompletionRequest, GenerateRequest],
                         ids=lambda m: m.__name__)
def test_the_frontends_and_the_workers_models_carry_every_control_field(model: type[BaseModel]) -> None:
    assert set(CONTROL_FIELDS) <= set(model.model_fields)


def test_a_model_that_declares_other_fields_than_the_table_is_refused_at_import() -> None:
    class Stale(BaseModel):
        logit_bias: object = None

    with pytest.raises(TypeError, match="the control table has"):
        control_fields._declares_the_table(Stale)


def test_the_frontend_forwards_each_control_field_as_sent() -> None:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 **VALUES})
    assert body.controls() == VALUES
    assert body.generate_request("r").controls() == VALUES


def test_each_control_field_becomes_the_kind_the_table_names() -> None:
    config = parse_config({"allow_request_kinds": sorted(CONTROL_FIELDS.values())})
    controls = with_controls(None, VALUES, config)
    leads = [c for c in CONTROLS if c.joins is None]  # a joining field's value goes into its lead's entry
    assert controls.origins == [c.name for c in leads]
    assert controls.entries == [{"kind": c.kind, **{j.value_field: VALUES[j.name] for j in CONTROLS
                                                    if j.name == c.name or j.joins == c.name}} for c in leads]
