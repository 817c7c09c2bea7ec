"""Per-request specs through the real ``openai`` client against ``agg.sh --logits-spec examples/deployment.yaml``."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from typing import Any

import httpx
import openai
import pytest

from .conftest import model_name, openai_client
from .launcher import PYTHON, ROOT, WORKER_AUTH, Deployment, wait_until

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Tell me something."}]


def one_token(tokenizer: Any, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is not one token: {ids}"
    return ids[0]


def chat(d: Deployment, entries: list[dict[str, Any]] | None, **kwargs: Any) -> Any:
    body: dict[str, Any] = dict(kwargs.pop("extra_body", {}))
    if entries is not None:
        body["logits_processors"] = entries
    return openai_client(d).chat.completions.create(model=model_name(d), messages=MESSAGES, extra_body=body, **kwargs)


# --- each allowed kind ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["Hello world!", "The answer is 42.", "ünïcödé → ok"])
def test_forced_text(spec_agg: Deployment, text: str) -> None:
    reply = chat(spec_agg, [{"kind": "forced_text", "text": text}])
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == "stop"


def test_forced_sequence(spec_agg: Deployment, tokenizer: Any) -> None:
    ids = tokenizer.encode("Yes, please.", add_special_tokens=False)
    entry = {"kind": "forced_sequence", "token_ids": ids, "eos_token_id": tokenizer.eos_token_id}
    reply = openai_client(spec_agg).completions.create(model=model_name(spec_agg), prompt="Q:", max_tokens=40,
                                                       extra_body={"logits_processors": [entry]})
    assert reply.choices[0].text == "Yes, please."


def test_allowed_tokens_restrict_the_output(spec_agg: Deployment, tokenizer: Any) -> None:
    a, b = one_token(tokenizer, " the"), one_token(tokenizer, " and")
    reply = chat(spec_agg, [{"kind": "allowed_tokens", "token_ids": [a, b]}], max_tokens=8, temperature=1.0, seed=3)
    assert re.fullmatch(r"( the| and){8}", reply.choices[0].message.content or "")


def test_banned_tokens_remove_a_token(spec_agg: Deployment, tokenizer: Any) -> None:
    a, b = one_token(tokenizer, " the"), one_token(tokenizer, " and")
    reply = chat(spec_agg, [{"kind": "allowed_tokens", "token_ids": [a, b]}, {"kind": "banned_tokens", "token_ids": [a]}],
                 max_tokens=6, temperature=1.0, seed=3)
    assert reply.choices[0].message.content == " and" * 6


def test_logit_bias_dominates(spec_agg: Deployment, tokenizer: Any) -> None:
    a = one_token(tokenizer, " the")
    reply = chat(spec_agg, [{"kind": "logit_bias", "bias": {str(a): 100.0}}], max_tokens=5, temperature=0)
    assert reply.choices[0].message.content == " the" * 5


def test_min_tokens_holds_back_the_stop_token(spec_agg: Deployment, tokenizer: Any) -> None:
    a, eos = one_token(tokenizer, " the"), tokenizer.eos_token_id
    base = [{"kind": "allowed_tokens", "token_ids": [a], "eos_token_id": eos}, {"kind": "logit_bias", "bias": {str(eos): 100.0}}]
    short = chat(spec_agg, base, max_tokens=20, temperature=0)
    assert short.choices[0].message.content == "" and short.choices[0].finish_reason == "stop"
    held = chat(spec_agg, [*base, {"kind": "min_tokens", "min_tokens": 5, "stop_token_ids": [eos]}], max_tokens=20,
                temperature=0)
    assert held.choices[0].message.content == " the" * 5
    assert held.choices[0].finish_reason == "stop"


def test_thinking_budget_forces_the_end_marker(spec_agg: Deployment, tokenizer: Any) -> None:
    """Greedy output is " the" forever; one " the" opens the budget, two more use it up, then " end"."""
    start, end = one_token(tokenizer, " the"), one_token(tokenizer, " end")
    entries = [{"kind": "logit_bias", "bias": {str(start): 100.0}},
               {"kind": "thinking_budget", "start_token_ids": [start], "end_token_ids": [end], "budget": 2}]
    baseline = chat(spec_agg, entries[:1], max_tokens=8, temperature=0).choices[0].message.content
    assert " end" not in baseline
    text = chat(spec_agg, entries, max_tokens=8, temperature=0).choices[0].message.content or ""
    assert text.startswith(" the the the end"), text


def test_deployment_spec_bans_pad_everywhere(spec_agg: Deployment, tokenizer: Any) -> None:
    """``examples/deployment.yaml`` bans <|pad|> (id 2); a request cannot bring it back."""
    eos = tokenizer.eos_token_id
    reply = chat(spec_agg, [{"kind": "allowed_tokens", "token_ids": [2], "eos_token_id": eos}], max_tokens=5, temperature=0)
    assert reply.choices[0].message.content == "" and reply.choices[0].finish_reason == "stop"


# --- streaming and concurrency ----------------------------------------------------------------


def test_32_concurrent_streams_each_get_their_own_text(spec_agg: Deployment) -> None:
    from openai import AsyncOpenAI

    texts = [f"Request {i}: the answer is {i * 7}." for i in range(32)]
    model = model_name(spec_agg)

    async def one(client: AsyncOpenAI, text: str) -> str:
        stream = await client.chat.completions.create(
            model=model, messages=MESSAGES, stream=True,
            extra_body={"logits_processors": [{"kind": "forced_text", "text": text}]})
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def run_all() -> list[str]:
        async with AsyncOpenAI(base_url=spec_agg.base_url, api_key="unused", max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(one(client, t) for t in texts))

    assert asyncio.run(run_all()) == texts


@pytest.mark.slow  # timing-sensitive on 2 shared cores: run with -m slow (see the docstring)
def test_cancelled_stream_aborts_the_engine_request(spec_agg: Deployment) -> None:
    """A client that hangs up while its engine request runs gets that request aborted.

    Runs after many requests on a warm engine, the case where the worker's stream (and, under CPU
    load, the frontend's) never suspended and so never noticed the client had gone. Sixteen samples
    of 2000 tokens keep the engine busy for ~7 s. On this 2-core machine a try can get its response
    headers only after the request has finished on its own (the frontend waiting for a CPU, see
    docs/reliability.md): such a try says nothing about hang-ups and is repeated. A try whose request was still running when the
    client hung up must end aborted; if no try of six gets there, the test is skipped with the
    figures, since the hang-up path was never exercised.

    Deselected by default: in full runs a try's request can be near its end when the check says it
    is running (one clean-clone CI run failed that way), so the outcome depends on scheduling. What
    runs every time instead: ``tests/serve/http/test_closing_stream.py`` (the frontend closes the worker stream
    when its client goes) and ``test_faults.py`` (a worker aborts the engine requests of a frontend
    that went away)."""
    worker = spec_agg.worker_url(1)
    model = model_name(spec_agg)
    tries: list[tuple[float, int]] = []  # (s to the headers, requests in flight just before the hang-up)
    for _ in range(6):
        before = httpx.get(f"{worker}/stats", headers=WORKER_AUTH).json()
        started = time.monotonic()
        with httpx.stream("POST", f"{spec_agg.base_url}/chat/completions", timeout=60, json={
            "model": model, "messages": MESSAGES, "stream": True, "max_tokens": 2000, "ignore_eos": True, "n": 16,
        }) as response:
            headers_s = round(time.monotonic() - started, 2)
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines)
            next(lines)
            running = httpx.get(f"{worker}/stats", headers=WORKER_AUTH).json()["in_flight"]  # the client is still connected
        tries.append((headers_s, running))
        stats = wait_until(lambda: (s := httpx.get(f"{worker}/stats", headers=WORKER_AUTH).json())["in_flight"] == 0 and s, 30,
                           "the worker to finish the request")
        assert stats["requests"] == before["requests"] + 1
        if running:
            assert stats["aborted"] == before["aborted"] + 1, f"a hang-up did not abort a running request: {tries}"
            return
    pytest.skip(f"no try's request was still running when its client hung up (s to the headers, in flight): {tries}")


# --- bad input: 400 naming the field, and the server keeps serving ---------------------------

BAD_ENTRIES = [
    ([{"kind": "banned_tokens", "token_ids": [1, -1]}], "logits_processors[0].token_ids[1]"),
    ([{"kind": "banned_tokens", "token_ids": [1, "2"]}], "logits_processors[0].token_ids[1]"),
    ([{"kind": "banned_tokens", "token_ids": [1, True]}], "logits_processors[0].token_ids[1]"),
    ([{"kind": "banned_tokens", "token_ids": []}], "logits_processors[0].token_ids"),
    ([{"kind": "forced_sequence", "token_ids": [5]}], "logits_processors[0].eos_token_id"),
    ([{"kind": "forced_text", "text": "hi", "extra": 1}], "logits_processors[0].extra"),
    ([{"kind": "no_such_kind"}], "logits_processors[0]"),
    ([{"token_ids": [1]}], "logits_processors[0]"),
    ([{"kind": "python", "factory": "os:system"}], "logits_processors[0]"),
    ([{"kind": "forced_text", "text": "x"}] * 9, "logits_processors"),
    ({"kind": "forced_text", "text": "x"}, "logits_processors"),
    ([{"kind": "logit_bias", "bias": {"abc": 1.0}}], "logits_processors[0].bias"),
    # Only the worker knows the model's vocabulary size (1024): checked there, relayed as 400.
    ([{"kind": "banned_tokens", "token_ids": [5000]}], "logits_processors[0].token_ids[0]"),
]


@pytest.mark.parametrize(("entries", "param"), BAD_ENTRIES, ids=[p + f"-{i}" for i, (_, p) in enumerate(BAD_ENTRIES)])
def test_bad_entries_get_400_naming_the_field(spec_agg: Deployment, entries: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        chat(spec_agg, entries, stream=False)
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert body["param"].startswith(param), body
    assert param.split(".")[-1].split("[")[0] in body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_bad_entry_rejected_before_streaming(spec_agg: Deployment, stream: bool) -> None:
    with pytest.raises(openai.BadRequestError):
        chat(spec_agg, [{"kind": "python", "factory": "os:system"}], stream=stream)


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"prompt": None}, "prompt"),
])
def test_bad_openai_fields_get_400(spec_agg: Deployment, body: dict[str, Any], param: str) -> None:
    path = "completions" if "prompt" in body else "chat/completions"
    r = httpx.post(f"{spec_agg.base_url}/{path}", json={"model": model_name(spec_agg), **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_invalid_json_and_unknown_model(spec_agg: Deployment) -> None:
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", json={"model": "nope", "messages": MESSAGES}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_server_still_serves_after_bad_requests(spec_agg: Deployment) -> None:
    assert chat(spec_agg, [{"kind": "forced_text", "text": "still here"}]).choices[0].message.content == "still here"


# --- untrusted payloads -----------------------------------------------------------------------


def _hello_payload(tokenizer: Any) -> list[dict[str, Any]]:
    return [{"kind": "forced_sequence", "token_ids": tokenizer.encode("Hello world!", add_special_tokens=False),
             "eos_token_id": tokenizer.eos_token_id}]


@pytest.mark.parametrize("field", ["vllm_xargs", "extra_args"])
def test_smuggled_payload_is_dropped(spec_agg: Deployment, tokenizer: Any, field: str) -> None:
    payload = _hello_payload(tokenizer)
    for value in (payload, json.dumps(payload)):
        reply = chat(spec_agg, None, max_tokens=6, temperature=0, extra_body={field: {"dynamo_logits": value}})
        assert reply.choices[0].message.content != "Hello world!"
        assert reply.choices[0].finish_reason == "length"


def test_worker_drops_a_smuggled_payload_too(spec_agg: Deployment, tokenizer: Any) -> None:
    """Defense in depth: a caller that bypasses the frontend cannot activate processors either."""
    r = httpx.post(f"{spec_agg.worker_url(1)}/generate", timeout=60, headers=WORKER_AUTH, json={
        "request_id": "smuggle", "prompt": "Hi", "sampling": {"max_tokens": 6, "temperature": 0},
        "extra_args": {"dynamo_logits": _hello_payload(tokenizer)}})
    assert r.status_code == 200
    chunks = [json.loads(line) for line in r.text.splitlines()]
    assert "".join(c.get("text", "") for c in chunks) != "Hello world!"
    r = httpx.post(f"{spec_agg.worker_url(1)}/generate", timeout=60, headers=WORKER_AUTH, json={
        "request_id": "python", "prompt": "Hi", "logits_processors": [{"kind": "python", "factory": "os:system"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logits_processors[0].kind"


# --- observability and examples ---------------------------------------------------------------


def test_metrics_count_requests_errors_and_kinds(spec_agg: Deployment) -> None:
    chat(spec_agg, [{"kind": "forced_text", "text": "metrics"}])
    text = httpx.get(f"{spec_agg.url}/metrics").text
    assert re.search(r'dynlogits_requests_total\{endpoint="chat"\} [1-9]', text)
    assert 'dynlogits_request_errors_total{endpoint="chat",status="400"}' in text
    assert re.search(r'dynlogits_logits_processor_requests_total\{kind="forced_text",source="request"\} [1-9]', text)
    assert 'dynlogits_logits_processor_requests_total{kind="banned_tokens",source="deployment"}' in text
    assert 'dynlogits_active_logits_processors' in text
    assert 'dynlogits_request_latency_seconds_bucket' in text
    assert 'dynlogits_workers_ready{role="agg"} 1.0' in text


def test_models_and_health(spec_agg: Deployment) -> None:
    models = openai_client(spec_agg).models.list().data
    assert [m.id for m in models] == ["dynlogits-tiny"]
    health = httpx.get(f"{spec_agg.url}/health").json()
    assert health["status"] == "ok" and health["workers"][0]["ready"]
    info = httpx.get(f"{spec_agg.worker_url(1)}/ready", headers=WORKER_AUTH).json()
    assert info["adapter_registered"] and info["deployment_kinds"] == ["banned_tokens"]


def test_example_client_runs(spec_agg: Deployment) -> None:
    started = time.monotonic()
    out = subprocess.run([PYTHON, str(ROOT / "examples" / "openai_client.py"), "--base-url", spec_agg.base_url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "forced_text: The answer is 42." in out.stdout
    assert "streamed: Streamed, token by token." in out.stdout
    assert "rejected: logits_processors[0].token_ids[1]" in out.stdout
    assert time.monotonic() - started < 120
