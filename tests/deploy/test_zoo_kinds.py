"""The zoo's kinds through the real ``openai`` client against ``agg.sh --logits-spec
examples/deployment.yaml`` (which allows them and bounds a prompt-bound kind's prompt to 1024
tokens): a multiple-choice answer is one of the given texts; a trigger forces its phrase; a
deadline counts from the request's arrival at the deployment; a prompt over ``max_prompt_tokens``
with a ``prompt_tokens`` entry is a 400 naming the prompt; choices that the request's own
``min_tokens`` would leave without EOS are a 400 naming the choice entry."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import Deployment

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "Is the sky blue? Answer yes, no or maybe."}]
CHOICES = ["yes", "no", "maybe"]


def ask(d: Deployment, entries: list[dict[str, Any]], messages: list[dict[str, str]] = QUESTION, **kwargs: Any) -> Any:
    return openai_client(d).chat.completions.create(model=model_name(d), messages=messages,
                                                    extra_body={"logits_processors": entries}, **kwargs)


@pytest.mark.parametrize("seed", range(4))
def test_a_multiple_choice_prompt_is_answered_with_one_of_the_given_texts(spec_agg: Deployment, seed: int) -> None:
    reply = ask(spec_agg, [{"kind": "multiple_choice", "texts": CHOICES}], max_tokens=32, temperature=1.0, seed=seed)
    assert reply.choices[0].message.content in CHOICES
    assert reply.choices[0].finish_reason == "stop"


def test_every_choice_is_reachable_and_the_streamed_answer_is_one_of_them(spec_agg: Deployment) -> None:
    seen = set()
    for seed in range(24):
        stream = ask(spec_agg, [{"kind": "multiple_choice", "texts": CHOICES}], max_tokens=32, temperature=1.0,
                     seed=seed, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text in CHOICES
        seen.add(text)
    assert seen == set(CHOICES)


def test_a_trigger_forces_its_phrase_once_after_the_model_writes_it(spec_agg: Deployment, tokenizer: Any) -> None:
    (word,) = tokenizer.encode(" yes", add_special_tokens=False)  # made certain by the bias
    phrase = " forced phrase"
    n = len(tokenizer.encode(phrase, add_special_tokens=False))
    reply = ask(spec_agg, [{"kind": "logit_bias", "bias": {str(word): 100}},
                           {"kind": "trigger", "trigger_token_ids": [word, word], "phrase_text": phrase}],
                max_tokens=2 + n + 3, temperature=0)
    assert reply.choices[0].message.content == " yes yes" + phrase + " yes yes yes"


def test_a_deadline_counts_from_the_requests_arrival(spec_agg: Deployment, tokenizer: Any) -> None:
    due = ask(spec_agg, [{"kind": "deadline", "seconds": 0.001}], max_tokens=16, temperature=0)
    assert due.choices[0].message.content == "" and due.choices[0].finish_reason == "stop"
    later = ask(spec_agg, [{"kind": "min_tokens", "min_tokens": 4, "stop_token_ids": [tokenizer.eos_token_id]},
                           {"kind": "deadline", "seconds": 3600}], max_tokens=4, temperature=0)
    assert later.choices[0].finish_reason == "length" and later.usage.completion_tokens == 4


def test_a_prompt_over_the_limit_of_a_prompt_bound_entry_is_a_400_naming_the_prompt(spec_agg: Deployment,
                                                                                    tokenizer: Any) -> None:
    long = [{"role": "user", "content": "word " * 600}]
    size = len(tokenizer.apply_chat_template(long, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
    assert 1024 < size < 2048  # over the deployment's max_prompt_tokens, inside the model's context
    with pytest.raises(openai.BadRequestError) as err:
        ask(spec_agg, [{"kind": "prompt_tokens", "mode": "boost"}], messages=long, max_tokens=2)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == "messages", body
    assert body["message"] == (f"messages: is {size} tokens; logits_processors[0] (prompt_tokens) reads at most 1024 "
                               "(limit max_prompt_tokens)")
    assert ask(spec_agg, [{"kind": "banned_tokens", "token_ids": [5]}], messages=long, max_tokens=2).choices
    short = ask(spec_agg, [{"kind": "prompt_tokens", "mode": "restrict"}], max_tokens=4, temperature=0)
    assert short.choices[0].finish_reason in ("stop", "length")


def test_choices_that_min_tokens_would_leave_without_eos_are_a_400_naming_the_choice(spec_agg: Deployment,
                                                                                     tokenizer: Any) -> None:
    yes = tokenizer.encode("yes", add_special_tokens=False)  # once written, the whole choice: EOS is due next
    assert len(yes) < 8
    entries = [{"kind": "min_tokens", "min_tokens": 8, "stop_token_ids": [tokenizer.eos_token_id]},
               {"kind": "multiple_choice", "texts": ["yes"]}]
    with pytest.raises(openai.BadRequestError) as err:
        ask(spec_agg, entries, max_tokens=16)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == "logits_processors[1]", body
    assert body["message"] == (f"logits_processors[1]: contradicts the entries before it: it allows only EOS after the "
                               f"whole choice {yes}, which earlier entries mask at output position {len(yes)}; the row would "
                               "have no token left")
    assert ask(spec_agg, entries[1:], max_tokens=4, temperature=0).choices[0].message.content == "yes"
