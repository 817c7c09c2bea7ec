"""A request whose logits-processor entries fail during generation is answered as failed, never as a
plain ``finish_reason: "stop"`` (issue 47, item 4), through ``launch/agg.sh`` and the stock ``openai``
client: a 422 in OpenAI's error shape naming the failing entry's path, the output position and the
reason; streamed, the chunks so far, then an error event with the same, then ``data: [DONE]``.
Counted by reason in the frontend's ``/metrics`` and the worker's ``/stats``.

The three ways a request's entries leave no token that admission cannot see (it does not know the
clock, the prompt, or where a scoped entry's phase starts): an expired ``deadline`` beside a
``multiple_choice`` (no token at output position 0), a ``trigger`` scoped to the answer beside a
choice that writes it (the choice and the phrase disagree at position 1), and a ``prompt_tokens``
restrict whose prompt holds none of the choice's tokens (refused when the engine realizes it)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import WORKER_AUTH, Deployment

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Say something."}]
CHOICE = {"kind": "multiple_choice", "texts": ["hello world"]}
EXPIRED = {"kind": "deadline", "seconds": 1e-9}
RESTRICT = {"kind": "prompt_tokens", "mode": "restrict"}


def _trigger_on_the_choice(tokenizer: Any) -> dict[str, Any]:
    """A trigger scoped to the answer on the choice's first token whose phrase the choice does not go on with."""
    first = tokenizer.encode("hello world", add_special_tokens=False)[0]
    other = tokenizer.encode(" the", add_special_tokens=False)[-1]
    return {"kind": "trigger", "trigger_token_ids": [first], "phrase_token_ids": [other], "scope": "answer"}


def _chat(d: Deployment, entries: list[dict[str, Any]], **kwargs: Any) -> Any:
    return openai_client(d).chat.completions.create(model=model_name(d), messages=MESSAGES, max_tokens=16,
                                                    temperature=0, extra_body={"logits_processors": entries}, **kwargs)


def _failures(d: Deployment) -> tuple[dict[str, float], dict[str, int]]:
    """The failed-request counters by reason: the frontend's (``dynlogits_request_failures_total``,
    endpoint ``chat``) and the worker's (``/stats`` ``failures``)."""
    text = httpx.get(f"{d.url}/metrics", timeout=30).text
    frontend = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^dynlogits_request_failures_total\{endpoint="chat",reason="([a-z_]+)"\} (\S+)$', text, re.MULTILINE)}
    worker = httpx.get(f"{d.worker_url()}/stats", timeout=30, headers=WORKER_AUTH).json().get("failures") or {}
    return frontend, worker


def _grew(before: tuple[dict[str, Any], dict[str, Any]], after: tuple[dict[str, Any], dict[str, Any]]) -> list[dict[str, int]]:
    return [{k: int(a.get(k, 0) - b.get(k, 0)) for k in a if a.get(k, 0) != b.get(k, 0)} for b, a in zip(before, after)]


def test_a_choice_alone_still_finishes_with_stop(open_agg: Deployment) -> None:
    """The control: the same choice without the entry that empties its row is answered normally."""
    reply = _chat(open_agg, [CHOICE])
    assert reply.choices[0].message.content == "hello world"
    assert reply.choices[0].finish_reason == "stop"


def test_an_expired_deadline_beside_a_choice_is_a_422_naming_the_deadline_and_position_0(open_agg: Deployment) -> None:
    before = _failures(open_agg)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        _chat(open_agg, [CHOICE, EXPIRED])
    err = caught.value
    assert err.status_code == 422
    assert err.body is not None and set(err.body) == {"message", "type", "param", "code"}
    assert (err.param, err.code, err.type) == ("logits_processors[1]", "no_token_left", "logits_processor_error")
    assert "logits_processors[1] (deadline)" in err.message and "output position 0" in err.message
    assert _grew(before, _failures(open_agg)) == [{"no_token_left": 1}, {"no_token_left": 1}]


def test_a_restrict_whose_prompt_holds_no_choice_token_is_a_422_naming_both_entries(open_agg: Deployment) -> None:
    before = _failures(open_agg)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        _chat(open_agg, [CHOICE, RESTRICT])
    err = caught.value
    assert (err.param, err.code) == ("logits_processors[1]", "not_realized")
    assert "logits_processors[0]" in err.message and "output position 0" in err.message
    assert "dynamo_logits" not in err.message  # the engine's name for the payload is not the client's
    assert _grew(before, _failures(open_agg)) == [{"not_realized": 1}, {"not_realized": 1}]


def test_streamed_the_chunks_so_far_then_an_error_event_then_done(open_agg: Deployment, tokenizer: Any) -> None:
    """The choice writes its first token, the trigger fires on it and forces a phrase the choice does
    not go on with: the client gets that token, then the error (never a ``stop``), then the end."""
    before = _failures(open_agg)
    stream = _chat(open_agg, [CHOICE, _trigger_on_the_choice(tokenizer)], stream=True)
    content: list[str] = []
    finishes: list[str | None] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            for choice in chunk.choices:
                content.append(choice.delta.content or "")
                finishes.append(choice.finish_reason)
    err = caught.value
    assert (err.code, err.param) == ("no_token_left", "logits_processors[1]")
    assert "logits_processors[1] (trigger)" in err.message and "output position 1" in err.message
    assert "".join(content) == "hello" and "stop" not in finishes
    assert _grew(before, _failures(open_agg)) == [{"no_token_left": 1}, {"no_token_left": 1}]


def test_the_stream_ends_with_done_after_the_error_event(open_agg: Deployment) -> None:
    """The raw SSE: no ``finish_reason`` chunk, one error event in OpenAI's shape, then ``data: [DONE]``
    (as vLLM's own server ends a stream that failed mid-way)."""
    body = {"model": model_name(open_agg), "messages": MESSAGES, "max_tokens": 16, "stream": True,
            "logits_processors": [CHOICE, EXPIRED]}
    with httpx.stream("POST", f"{open_agg.base_url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    errors = [e for e in events[:-1] if '"error"' in e]
    assert len(errors) == 1 and events[-2] == errors[0]
    detail = json.loads(errors[0])["error"]
    assert (detail["param"], detail["code"], detail["type"]) == ("logits_processors[1]", "no_token_left",
                                                                 "logits_processor_error")
    assert '"finish_reason":"stop"' not in "".join(events).replace(" ", "")
