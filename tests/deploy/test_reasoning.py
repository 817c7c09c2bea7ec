"""Reasoning phases through the real ``openai`` client against ``agg.sh`` serving the embedded model's
reasoning variant (``make-model --reasoning``): its DeepSeek-R1-style chat template ends the prompt
with ``<think>\\n``, so generation starts inside a reasoning span, and the model folder declares its
``<think>``/``</think>`` delimiters, which the worker gives every request (no operator ``reasoning:``).

Greedy decoding of the random-weight model never writes ``</think>`` on its own (checked), so every
``</think>`` in a reply is one a processor forced."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import model_name, openai_client
from .launcher import Deployment, free_port_block

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Tell me something."}]
END = "</think>"


@pytest.fixture(scope="module")
def reasoning_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dynlogits.model_builder import build_model

    return build_model(tmp_path_factory.mktemp("reasoning") / "model", reasoning=True)


@pytest.fixture(scope="module")
def reasoning_agg(reasoning_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    config = tmp_path_factory.mktemp("reasoning-config") / "deployment.yaml"
    config.write_text("allow_request_kinds: [thinking_budget, allowed_tokens]\n")
    d = Deployment("reasoning-agg", "agg.sh", free_port_block(2),
                   args=["--model", str(reasoning_model), "--logits-spec", str(config)],
                   env={"DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0"})
    d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def tokenizer(reasoning_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(reasoning_model))


def chat(d: Deployment, entries: list[dict[str, Any]] | None, max_tokens: int) -> str:
    body = {"logits_processors": entries} if entries is not None else {}
    reply = openai_client(d).chat.completions.create(model=model_name(d), messages=MESSAGES, max_tokens=max_tokens,
                                                     temperature=0, extra_body=body)
    return reply.choices[0].message.content or ""


def test_the_template_opens_the_span_in_the_prompt(tokenizer: Any) -> None:
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert ids.endswith("<think>\n")  # one thinking token ("\n") already in the span


def test_a_deepseek_r1_style_reasoning_is_cut_at_its_budget_counting_the_prompts_thinking_token(
        reasoning_agg: Deployment, tokenizer: Any) -> None:
    """Budget 4 on the model's delimiters: the prompt's "\\n" after ``<think>`` is the first thinking
    token, so ``</think>`` is forced after three generated tokens, the greedy output's own."""
    free = chat(reasoning_agg, None, max_tokens=12)
    assert END not in free
    three = chat(reasoning_agg, None, max_tokens=3)
    assert len(tokenizer.encode(three, add_special_tokens=False)) <= 3 and free.startswith(three)
    cut = chat(reasoning_agg, [{"kind": "thinking_budget", "budget": 4}], max_tokens=12)
    assert cut.startswith(three + END), (three, cut)


def test_an_allowed_set_scoped_to_the_answer_holds_only_after_the_reasoning(reasoning_agg: Deployment,
                                                                           tokenizer: Any) -> None:
    """The reasoning (cut at budget 3) is the model's own greedy text, tokens outside the set included;
    from ``</think>`` on only " the" and " and" are written (no EOS in the set: it runs to its length)."""
    allowed = [_one_token(tokenizer, " the"), _one_token(tokenizer, " and")]
    entries = [{"kind": "thinking_budget", "budget": 3},
               {"kind": "allowed_tokens", "token_ids": allowed, "scope": "answer"}]
    two = chat(reasoning_agg, None, max_tokens=2)
    text = chat(reasoning_agg, entries, max_tokens=10)
    reasoning, sep, answer = text.partition(END)
    assert sep and reasoning == two, text
    assert not re.fullmatch(r"( the| and)*", reasoning), reasoning  # the set did not hold in the reasoning
    assert re.fullmatch(r"( the| and){7}", answer), answer  # 10 tokens: 2 of reasoning, the end, 7 of answer


def _one_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return int(ids[0])
