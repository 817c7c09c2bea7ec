"""A hostile client's request fields, on a real deployment (``launch/agg.sh --logits-spec
examples/deployment.yaml``): nothing reaches the engine's internals, OpenAI's own logits fields do
what they say or are refused by name, and nothing a client sends is answered with a 5xx.

* engine-internal keys (``kv_transfer_params``...) in ``vllm_xargs`` / ``extra_args``: 400 naming
  the key, at the frontend and again at the worker, streaming or not (they were 500s with a traceback
  in the worker's log per request);
* ``logit_bias``, ``allowed_token_ids`` and ``bad_words`` (sent by the real ``openai`` client)
  change the answer exactly as asked where the deployment allows their kinds (a multi-token bad
  word such as "hello world" included), and are refused with a 400 naming them where it does not
  (they were accepted and ignored);
* other OpenAI/vLLM fields the deployment would ignore (``logprobs``, ...) are refused by name;
* the worker serves no ``/docs`` or ``/openapi.json``, and its ``/generate`` takes exactly one of
  ``prompt``, ``prompt_token_ids`` and ``messages``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import WORKER_AUTH, Deployment, extra_frontend

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Say something."}]


def _chat(d: Deployment, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{d.base_url}/chat/completions", timeout=60,
                      json={"model": model_name(d), "messages": MESSAGES, "max_tokens": 4, **body})


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


# --- engine-internal keys -----------------------------------------------------------------------

INTERNAL = [("kv_transfer_params", "x"), ("kv_transfer_params", 1), ("kv_transfer_params", ["a"]),
            ("ec_transfer_params", "x"), ("kv_cache_report_mode", "full")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("key", "value"), INTERNAL, ids=[f"{k}={v!r}" for k, v in INTERNAL])
def test_engine_internal_keys_are_refused_by_name_at_the_frontend_and_the_worker(
        spec_agg: Deployment, key: str, value: Any, stream: bool) -> None:
    mark = spec_agg.log_size()
    for field in ("vllm_xargs", "extra_args"):
        r = _chat(spec_agg, {"stream": stream, field: {key: value}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == f"{field}.{key}" and "engine-internal" in r.json()["error"]["message"]
    r = httpx.post(f"{spec_agg.worker_url(1)}/generate", timeout=60, headers=WORKER_AUTH, json={
        "request_id": "internal", "prompt": "Hi", "sampling": {"max_tokens": 4}, "extra_args": {key: value}})
    assert r.status_code == 400 and r.json()["error"]["param"] == f"extra_args.{key}", r.text
    with open(spec_agg.log_path, "rb") as log:  # type: ignore[arg-type]
        log.seek(mark)
        assert b"EngineGenerateError" not in log.read()


def test_vllms_top_level_transfer_params_are_refused(spec_agg: Deployment) -> None:
    r = _chat(spec_agg, {"kv_transfer_params": {"do_remote_prefill": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", r.text


# --- OpenAI's own logits fields ---------------------------------------------------------------


def test_logit_bias_from_the_openai_client_yields_the_biased_token(spec_agg: Deployment, tokenizer: Any) -> None:
    """``logit_bias={"ID": 100}`` at temperature 0: every generated token is ID, streaming or not."""
    token = _ids(tokenizer, " hello")
    assert len(token) == 1
    client = openai_client(spec_agg)
    unbiased = client.chat.completions.create(model=model_name(spec_agg), messages=MESSAGES, max_tokens=5,
                                              temperature=0).choices[0].message.content
    expected = tokenizer.decode(token * 5)
    assert unbiased != expected  # the evidence: without the bias the model says something else
    reply = client.chat.completions.create(model=model_name(spec_agg), messages=MESSAGES, max_tokens=5,
                                           temperature=0, logit_bias={str(token[0]): 100})
    assert reply.choices[0].message.content == expected
    stream = client.chat.completions.create(model=model_name(spec_agg), messages=MESSAGES, max_tokens=5,
                                            temperature=0, logit_bias={str(token[0]): 100}, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    text = client.completions.create(model=model_name(spec_agg), prompt="Say", max_tokens=5, temperature=0,
                                     logit_bias={str(token[0]): 100})
    assert text.choices[0].text == expected


def test_allowed_token_ids_restrict_the_answer(spec_agg: Deployment, tokenizer: Any) -> None:
    allowed = _ids(tokenizer, " Good") + _ids(tokenizer, "hello")
    reply = openai_client(spec_agg).chat.completions.create(
        model=model_name(spec_agg), messages=MESSAGES, max_tokens=6, temperature=0,
        extra_body={"allowed_token_ids": allowed})
    generated = _ids(tokenizer, reply.choices[0].message.content or "")
    assert generated and set(generated) <= set(allowed), (reply.choices[0].message.content, generated)


def test_bad_words_ban_a_single_token_word(spec_agg: Deployment, tokenizer: Any) -> None:
    """Biased towards " hello" (+100) then " Good" (+90): banning the word "hello" (both its forms,
    as vLLM does) leaves " Good"."""
    hello, good = _ids(tokenizer, " hello")[0], _ids(tokenizer, " Good")[0]
    bias = {str(hello): 100, str(good): 90}
    reply = openai_client(spec_agg).chat.completions.create(model=model_name(spec_agg), messages=MESSAGES, max_tokens=4,
                                                            temperature=0, logit_bias=bias, extra_body={"bad_words": ["hello"]})
    assert reply.choices[0].message.content == tokenizer.decode([good] * 4)


#: Only " hello", " world" and " Hello", preferred in that order (+100, +50, +25); "hello hello" banned,
#: so the answer alternates " hello world hello world ..." and says "hello world", unless that is banned
#: too: then " hello Hello hello Hello ...". (vLLM bans a word's bare form, and its form with a leading
#: space only where that has as many tokens: "world world" could not ban " world world" here.)
HELLO_WORLD = {"max_tokens": 8, "temperature": 0}


def _hello_world_body(tokenizer: Any, bad_words: list[str]) -> dict[str, Any]:
    hello, world, cap = (_ids(tokenizer, w)[0] for w in (" hello", " world", " Hello"))
    return {"logit_bias": {str(hello): 100, str(world): 50, str(cap): 25},
            "extra_body": {"allowed_token_ids": [hello, world, cap], "bad_words": bad_words}}


def test_bad_words_ban_hello_world_and_the_openai_client_never_sees_it(spec_agg: Deployment, tokenizer: Any) -> None:
    """A multi-token word ("hello world" is two tokens, in both of vLLM's forms) is banned exactly:
    its last token goes whenever the answer ends with the rest, streaming or not."""
    assert [len(_ids(tokenizer, w)) for w in ("hello world", " hello world", " Hello")] == [2, 2, 1]
    client, model = openai_client(spec_agg), model_name(spec_agg)
    free = client.chat.completions.create(model=model, messages=MESSAGES, **HELLO_WORLD,
                                          **_hello_world_body(tokenizer, ["hello hello"])).choices[0].message.content
    assert free == " hello world" * 4, free  # the evidence: without the ban the answer says it
    banned = _hello_world_body(tokenizer, ["hello hello", "hello world"])
    reply = client.chat.completions.create(model=model, messages=MESSAGES, **HELLO_WORLD, **banned)
    answer = reply.choices[0].message.content
    assert answer == " hello Hello" * 4, answer
    stream = client.chat.completions.create(model=model, messages=MESSAGES, **HELLO_WORLD, **banned, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer


@pytest.mark.parametrize(("controls", "param"), [({"logit_bias": {"abc": 5}}, 'logit_bias["abc"]'),
                                                 ({"logit_bias": {"5": 250}}, 'logit_bias["5"]'),
                                                 ({"logit_bias": {"99999999": 5}}, 'logit_bias["99999999"]'),
                                                 ({"allowed_token_ids": [-1]}, "allowed_token_ids[0]")])
def test_bad_logits_fields_are_400s_naming_them(spec_agg: Deployment, controls: dict[str, Any], param: str) -> None:
    r = _chat(spec_agg, controls)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.fixture(scope="module")
def narrow_frontend(spec_agg: Deployment) -> Iterator[Deployment]:
    """A second frontend allowing only ``forced_text``, in front of spec_agg's worker."""
    with extra_frontend("narrow", "--agg-worker", spec_agg.worker_url(1), "--allow-request-kinds", "forced_text") as url:
        yield Deployment("narrow-fields", "agg.sh", int(url.rsplit(":", 1)[1]))  # only its URLs are used


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"logit_bias": {"426": 100}}, "logit_bias"),
    ({"extra_body": {"allowed_token_ids": [426]}}, "allowed_token_ids"),
    ({"extra_body": {"bad_words": ["hello"]}}, "bad_words"),
])
def test_a_logits_field_whose_kind_is_not_allowed_is_a_400_naming_it(narrow_frontend: Deployment,
                                                                     kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(narrow_frontend).chat.completions.create(model=model_name(narrow_frontend), messages=MESSAGES,
                                                               max_tokens=4, temperature=0, **kwargs)
    body = err.value.body
    assert body["param"] == param and "does not allow" in body["message"], body  # type: ignore[index]


@pytest.mark.parametrize(("field", "value"), [("logprobs", True), ("top_logprobs", 3), ("tools", [{"type": "function"}]),
                                              ("response_format", {"type": "json_object"}),
                                              ("repetition_penalty", 1.3), ("min_tokens", 5)])
def test_fields_the_deployment_would_ignore_are_refused_by_name(spec_agg: Deployment, field: str, value: Any) -> None:
    r = _chat(spec_agg, {field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert "not supported" in r.json()["error"]["message"]


def test_neutral_values_of_those_fields_are_accepted(spec_agg: Deployment) -> None:
    r = _chat(spec_agg, {"logprobs": False, "tools": [], "response_format": {"type": "text"}, "logit_bias": {},
                         "bad_words": [], "repetition_penalty": 1.0})
    assert r.status_code == 200, r.text


# --- the worker's surface -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_the_worker_serves_no_api_docs(spec_agg: Deployment, path: str) -> None:
    assert httpx.get(f"{spec_agg.worker_url(1)}{path}", timeout=30, headers=WORKER_AUTH).status_code == 404


@pytest.mark.parametrize("prompt", [{"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]},
                                    {"prompt": "Hi", "prompt_token_ids": [5, 6]}, {}],
                         ids=["prompt and messages", "prompt and token ids", "neither"])
def test_generate_takes_exactly_one_prompt(spec_agg: Deployment, prompt: dict[str, Any]) -> None:
    r = httpx.post(f"{spec_agg.worker_url(1)}/generate", timeout=60, headers=WORKER_AUTH,
                   json={"request_id": "one", "sampling": {"max_tokens": 2}, **prompt})
    assert r.status_code == 400, r.text
    assert "exactly one of prompt, prompt_token_ids and messages" in r.json()["error"]["message"]


def test_the_worker_maps_and_checks_the_logits_fields_itself(spec_agg: Deployment, tokenizer: Any) -> None:
    """A caller bypassing the frontend gets the same mapping and the same named refusals."""
    hello = _ids(tokenizer, " hello")[0]
    url = f"{spec_agg.worker_url(1)}/generate"
    base = {"request_id": "controls", "prompt": "Hi", "sampling": {"max_tokens": 3, "temperature": 0}}
    r = httpx.post(url, timeout=60, headers=WORKER_AUTH, json={**base, "logit_bias": {str(hello): 100}})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line) for line in r.text.splitlines()]
    assert [t for c in chunks for t in c.get("token_ids", [])] == [hello] * 3
    r = httpx.post(url, timeout=60, headers=WORKER_AUTH, json={**base, "logit_bias": {str(hello): 100},
                                                                "bad_words": ["hello hello"]})
    tokens = [t for c in (json.loads(line) for line in r.text.splitlines()) for t in c.get("token_ids", [])]
    assert r.status_code == 200 and tokens[0] == hello and tokens[1] != hello, (r.text, tokens)  # never twice in a row
    r = httpx.post(url, timeout=60, headers=WORKER_AUTH, json={**base, "bad_words": ["hello", "  "]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words[1]", r.text
    r = httpx.post(url, timeout=60, headers=WORKER_AUTH, json={**base, "allowed_token_ids": [10**7]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("allowed_token_ids"), r.text
