"""The trust boundary: no route lets a client activate a processor the operator did not allow.

Every attempt below carries a processor that would make the answer exactly "Hello world!" if it
reached the engine: a ``forced_sequence`` payload, or a ``python`` entry naming a factory the
``spec_agg`` worker *has* allow-listed (``conftest.PYTHON_FACTORY``), so a leak would run it. The
answer must be a 400 naming the field, or a normal answer that is not the forced one. The
positive control (the same payload through the allowed ``logits_processors`` field) shows the
evidence is real. Oversized specs are refused with their limit before any worker sees them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import PYTHON_FACTORY, model_name, openai_client
from .launcher import PYTHON, ROOT, WORKER_AUTH, Deployment, free_port_block, wait_until

pytestmark = pytest.mark.engine

HELLO = "Hello world!"
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def hello(tokenizer: Any) -> dict[str, Any]:
    """The forced-sequence entry, the python entry and their JSON text, all answering HELLO."""
    ids = tokenizer.encode(HELLO, add_special_tokens=False)
    forced = {"kind": "forced_sequence", "token_ids": ids, "eos_token_id": tokenizer.eos_token_id}
    python = {"kind": "python", "factory": PYTHON_FACTORY,
              "kwargs": {"token_ids": ids, "repeat": 1, "eos_token_id": tokenizer.eos_token_id}}
    return {"forced": forced, "python": python}


def _post(d: Deployment, body: dict[str, Any] | bytes) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{d.base_url}/chat/completions", content=raw, timeout=60,
                      headers={"content-type": "application/json"})


def _base(d: Deployment) -> dict[str, Any]:
    return {"model": model_name(d), "messages": MESSAGES, "max_tokens": 6, "temperature": 0}


def test_positive_control_the_allowed_field_forces_the_answer(spec_agg: Deployment, hello: dict[str, Any]) -> None:
    r = _post(spec_agg, {**_base(spec_agg), "logits_processors": [hello["forced"]], "max_tokens": 20})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == HELLO


# (route, body fields) -> ignored: 200 and not forced; "param": refused with a 400 naming it.
ROUTES: list[tuple[str, Any, str | None]] = [
    ("vllm_xargs", lambda h: {"vllm_xargs": {"dynamo_logits": [h["forced"]]}}, None),
    ("vllm_xargs json text", lambda h: {"vllm_xargs": {"dynamo_logits": json.dumps([h["python"]])}}, None),
    ("extra_args", lambda h: {"extra_args": {"dynamo_logits": [h["python"]]}}, None),
    ("vllm_xargs upper case", lambda h: {"vllm_xargs": {"DYNAMO_LOGITS": json.dumps([h["forced"]])}}, None),
    ("vllm_xargs mixed case", lambda h: {"vllm_xargs": {"Dynamo_Logits": json.dumps([h["forced"]])}}, None),
    ("vllm_xargs nested", lambda h: {"vllm_xargs": {"extra_args": {"dynamo_logits": [h["forced"]]}}},
     "vllm_xargs.extra_args"),
    ("nvext", lambda h: {"nvext": {"logits_processors": [h["python"]], "extra_args": {"dynamo_logits": [h["forced"]]}}},
     None),
    ("custom_params", lambda h: {"custom_params": {"dynamo_logits": [h["forced"]]}}, None),
    ("custom_logit_processor", lambda h: {"custom_logit_processor": json.dumps({"callable": PYTHON_FACTORY}),
                                          "custom_params": {"token_ids": h["forced"]["token_ids"]}}, None),
    ("inside a message", lambda h: {"messages": [{**MESSAGES[0], "logits_processors": [h["forced"]]}]}, None),
    ("stream_options", lambda h: {"stream_options": {"logits_processors": [h["forced"]]}}, None),
    ("python kind", lambda h: {"logits_processors": [h["python"]]}, "logits_processors[0].kind"),
    ("python kind upper case", lambda h: {"logits_processors": [{**h["python"], "kind": "PYTHON"}]},
     "logits_processors[0]"),
    ("python kind with a space", lambda h: {"logits_processors": [{**h["python"], "kind": "python "}]},
     "logits_processors[0]"),
    ("nested list", lambda h: {"logits_processors": [[h["forced"]]]}, "logits_processors[0]"),
    ("payload as json text", lambda h: {"logits_processors": json.dumps([h["forced"]])}, "logits_processors"),
]


@pytest.mark.parametrize(("make", "param"), [(m, p) for _, m, p in ROUTES], ids=[r for r, _, _ in ROUTES])
def test_no_route_activates_a_processor(spec_agg: Deployment, hello: dict[str, Any], make: Any,
                                        param: str | None) -> None:
    r = _post(spec_agg, {**_base(spec_agg), **make(hello)})
    if param is None:
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] != HELLO
    else:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"].startswith(param), error
        assert error["type"] == "invalid_request_error"


def test_duplicate_keys_are_refused_not_resolved(spec_agg: Deployment, hello: dict[str, Any]) -> None:
    """Parsers disagree on which duplicate wins; the frontend accepts neither."""
    base = json.dumps(_base(spec_agg))[:-1]
    banned = json.dumps([{"kind": "banned_tokens", "token_ids": [5]}])
    body = f'{base}, "logits_processors": {banned}, "logits_processors": {json.dumps([hello["python"]])}}}'
    r = _post(spec_agg, body.encode())
    assert r.status_code == 400 and r.json()["error"]["param"] == "logits_processors", r.text
    entry = f'{{"kind": "banned_tokens", "token_ids": [5], "kind": "python", "factory": "{PYTHON_FACTORY}"}}'
    r = _post(spec_agg, f'{base}, "logits_processors": [{entry}]}}'.encode())
    assert r.status_code == 400 and r.json()["error"]["param"] == "logits_processors[0].kind", r.text


def test_a_caller_bypassing_the_frontend_cannot_either(spec_agg: Deployment, hello: dict[str, Any]) -> None:
    worker = spec_agg.worker_url(1) + "/generate"
    base = {"request_id": "trust", "prompt": "Hi", "sampling": {"max_tokens": 6, "temperature": 0}}
    for extra in ({"custom_params": {"dynamo_logits": [hello["forced"]]}},
                  {"custom_logit_processor": PYTHON_FACTORY}):
        r = httpx.post(worker, headers=WORKER_AUTH, json={**base, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(extra)), r.text
    r = httpx.post(worker, headers=WORKER_AUTH, json={**base, "logits_processors": [hello["python"]]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logits_processors[0].kind", r.text
    r = httpx.post(worker, headers=WORKER_AUTH, json={**base, "extra_args": {"dynamo_logits": json.dumps([hello["python"]])}}, timeout=60)
    assert r.status_code == 200
    assert "".join(json.loads(line).get("text", "") for line in r.text.splitlines()) != HELLO


@pytest.fixture(scope="module")
def narrow_frontend(spec_agg: Deployment) -> Iterator[Deployment]:
    """A second frontend allowing only ``banned_tokens``, in front of spec_agg's worker (which allows
    every kind): only the frontend's allow-list stands between a client and the engine."""
    port = free_port_block(1)
    proc = subprocess.Popen([PYTHON, "-m", "dynlogits.serve.frontend", "--port", str(port), "--agg-worker",
                             spec_agg.worker_url(1), "--allow-request-kinds", "banned_tokens"], cwd=ROOT)
    d = Deployment("narrow", "agg.sh", port)  # only its URLs are used; the process is ours
    try:
        wait_until(lambda: _ready(d), 60, "the narrow frontend")
        yield d
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(d: Deployment) -> bool:
    try:
        return httpx.get(f"{d.url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("kind", ["forced_sequence", "forced_text", "Banned_Tokens"])
def test_kinds_outside_the_allow_list_are_refused(narrow_frontend: Deployment, hello: dict[str, Any],
                                                  kind: str) -> None:
    entry = {"forced_sequence": hello["forced"], "forced_text": {"kind": "forced_text", "text": HELLO},
             "Banned_Tokens": {"kind": "Banned_Tokens", "token_ids": [5]}}[kind]
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(narrow_frontend).chat.completions.create(
            model=model_name(narrow_frontend), messages=MESSAGES, extra_body={"logits_processors": [entry]})
    assert err.value.body["param"].startswith("logits_processors[0]")  # type: ignore[index]
    allowed = openai_client(narrow_frontend).chat.completions.create(
        model=model_name(narrow_frontend), messages=MESSAGES, max_tokens=4,
        extra_body={"logits_processors": [{"kind": "banned_tokens", "token_ids": [5]}]})
    assert allowed.choices[0].finish_reason in ("stop", "length")


# --- oversized specs: refused with their limit, before any worker (so any tokenizer) sees them ---

OVERSIZED = [
    ([{"kind": "banned_tokens", "token_ids": list(range(200_000))}], "logits_processors[0].token_ids",
     "limit max_token_ids"),
    ([{"kind": "forced_text", "text": "x" * 100_000}], "logits_processors[0].text", "limit max_text_chars"),
    ([{"kind": "banned_tokens", "token_ids": [5]}] * 40, "logits_processors", "limit max_entries"),
    ([{"kind": "logit_bias", "bias": {str(i): 1.0 for i in range(50_000)}}], "logits_processors[0].bias",
     "limit max_bias_entries"),
]


@pytest.mark.parametrize(("entries", "param", "limit"), OVERSIZED, ids=[o[2] for o in OVERSIZED])
def test_oversized_specs_are_refused_before_any_worker_sees_them(spec_agg: Deployment, entries: Any, param: str,
                                                                 limit: str) -> None:
    worker_stats = spec_agg.worker_url(1) + "/stats"
    before = httpx.get(worker_stats, timeout=30, headers=WORKER_AUTH).json()["requests"]
    r = _post(spec_agg, {**_base(spec_agg), "logits_processors": entries})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and limit in error["message"], error
    assert httpx.get(worker_stats, timeout=30, headers=WORKER_AUTH).json()["requests"] == before


def test_a_huge_body_is_refused_unread_with_bounded_memory(spec_agg: Deployment) -> None:
    """64 MiB streamed without a length: the frontend stops reading at its 4 MiB limit and answers
    413; its memory does not grow by the body's size."""
    frontend = spec_agg.named("dynlogits.serve.frontend")[0]
    before = frontend.memory_info().rss

    def body() -> Iterator[bytes]:
        yield b'{"model": "dynlogits-tiny", "messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 2**20
        yield b'"}]}'

    r = httpx.post(f"{spec_agg.base_url}/chat/completions", content=body(), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "limit max_body_bytes" in r.json()["error"]["message"]
    assert frontend.memory_info().rss - before < 16 * 2**20
