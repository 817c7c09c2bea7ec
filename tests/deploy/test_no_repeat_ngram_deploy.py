"""TensorRT-LLM's ``no_repeat_ngram_size`` on an OpenAI body, through the real ``openai`` client against
``agg.sh --logits-spec examples/deployment.yaml`` (whose ``allow_request_kinds`` lists
``no_repeat_ngram``): the answer is the one the same ``no_repeat_ngram`` entry gives, not the
unbanned one, and a size the kind refuses is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import Deployment

pytestmark = pytest.mark.engine

STORY = [{"role": "user", "content": "Tell me a long story about a cat who wanted to fly."}]


def ask(d: Deployment, **body: Any) -> Any:
    return openai_client(d).chat.completions.create(model=model_name(d), messages=STORY, max_tokens=48, temperature=0,
                                                    extra_body=body)


def test_the_field_bans_what_the_entry_bans(spec_agg: Deployment) -> None:
    free = ask(spec_agg).choices[0].message.content
    by_field = ask(spec_agg, no_repeat_ngram_size=2).choices[0].message.content
    by_entry = ask(spec_agg, logits_processors=[{"kind": "no_repeat_ngram", "size": 2}]).choices[0].message.content
    assert by_field == by_entry
    assert by_field != free  # the premise: the greedy answer repeats a bigram unbanned


@pytest.mark.parametrize(("value", "rule"), [(0, "must be >= 1"), (33, "must be <= 32"), ("2", "must be an integer")])
def test_a_size_the_kind_refuses_is_a_400_naming_the_field(spec_agg: Deployment, value: Any, rule: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        ask(spec_agg, no_repeat_ngram_size=value)
    assert "no_repeat_ngram_size" in str(err.value) and rule in str(err.value)
