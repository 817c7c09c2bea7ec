"""Fuzzing the HTTP bodies of a real deployment (``launch/agg.sh``, real engine): the frontend's two
completion endpoints and, as a caller that bypasses the frontend would, the worker's ``/generate``.

Each body must end as a success or a 4xx in OpenAI's error shape: never a 5xx, never a broken or
erroring stream, never a hang (60 s per request), and afterwards the same engine still answers,
holds no per-request state, and has not grown without bound. A CI sample runs by default; the
10,000-case run is ``-m slow`` (its figures are in ``docs/reliability.md``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fuzz import strategies as s
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .launcher import WORKER_AUTH, Deployment, settled_stats

pytestmark = pytest.mark.engine

CI = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SLOW_FRONTEND = settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
SLOW_WORKER = settings(max_examples=2_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
#: Growth of the worker's and the frontend's resident memory a fuzz run may cause (see the docstring
#: of ``_memory``): allocator caches settle well below it, a per-request leak of ~10 KiB over the
#: 10,000-case run would not.
RSS_GROWTH_BOUND = 256 * 2**20
#: What one fuzz run saw, by status and by message (printed at the end; -s shows it).
SEEN: Counter[str] = Counter()


@pytest.fixture(scope="module")
def http(spec_agg: Deployment) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


def _error_shape(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error.get("param") is None or isinstance(error["param"], str), error
    return error


def check_frontend(http: httpx.Client, d: Deployment, endpoint: str, raw: bytes) -> None:
    r = http.post(d.url + PATHS[endpoint], content=raw, headers={"content-type": "application/json"})
    SEEN[f"frontend {r.status_code}"] += 1
    assert r.status_code in (200, 400, 404, 413), (r.status_code, r.text[:500], raw[:300])
    if r.status_code != 200:
        error = _error_shape(r)
        if r.status_code == 404:
            assert error["param"] == "model"
        SEEN[f"  {r.status_code} param={error['param'] is not None}: {error['message'][:60]}"] += 1
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[-300:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), event
    else:
        reply = r.json()
        assert reply["choices"] and all(c["finish_reason"] for c in reply["choices"]), reply


def check_worker(http: httpx.Client, d: Deployment, raw: bytes) -> None:
    r = http.post(d.worker_url(1) + "/generate", content=raw, headers={"content-type": "application/json", **WORKER_AUTH})
    SEEN[f"worker {r.status_code}"] += 1
    assert r.status_code in (200, 400, 413), (r.status_code, r.text[:500], raw[:300])
    if r.status_code != 200:
        _error_shape(r)
        return
    chunks = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert chunks and "usage" in chunks[-1] and not any("error" in c for c in chunks), chunks[-3:]


def _memory(d: Deployment) -> dict[str, int]:
    """RSS of the frontend process and of the worker with its engine (``/stats``)."""
    frontend = d.named("dynlogits.serve.frontend")[0]
    stats = httpx.get(d.worker_url(1) + "/stats", timeout=30, headers=WORKER_AUTH).json()
    return {"frontend": frontend.memory_info().rss, "worker": stats["rss_bytes"]}


def _still_serves(d: Deployment, before: dict[str, int]) -> None:
    """The engine that took the fuzz answers a forced request exactly, holds no per-request state,
    and neither process grew by more than ``RSS_GROWTH_BOUND``."""
    reply = httpx.post(d.url + PATHS["chat"], timeout=60, json={
        "model": s.MODEL, "messages": [{"role": "user", "content": "hi"}],
        "logits_processors": [{"kind": "forced_text", "text": "still serving"}]}).json()
    assert reply["choices"][0]["message"]["content"] == "still serving"
    stats = settled_stats(d.worker_url(1))
    assert stats["in_flight"] == 0 and stats["adapter_requests"] == 0, stats
    after = _memory(d)
    print("fuzz outcomes:", dict(sorted(SEEN.items())), "RSS before/after (MiB):",
          {k: (before[k] >> 20, after[k] >> 20) for k in after})
    for name in after:
        assert after[name] - before[name] < RSS_GROWTH_BOUND, (name, before[name], after[name])


def _fuzz(spec_agg: Deployment, http: httpx.Client, frontend_settings: settings, worker_settings: settings) -> None:
    SEEN.clear()
    before = _memory(spec_agg)

    @frontend_settings
    @given(st.sampled_from(["chat", "completion"]).flatmap(lambda e: st.tuples(st.just(e), s.raw_bodies(e))))
    def frontend(case: tuple[str, bytes]) -> None:
        check_frontend(http, spec_agg, *case)

    @worker_settings
    @given(s.worker_bodies())
    def worker(raw: bytes) -> None:
        check_worker(http, spec_agg, raw)

    frontend()
    worker()
    _still_serves(spec_agg, before)


def test_http_bodies_sample(spec_agg: Deployment, http: httpx.Client) -> None:
    _fuzz(spec_agg, http, CI, CI)


@pytest.mark.slow
def test_http_bodies_10k(spec_agg: Deployment, http: httpx.Client) -> None:
    _fuzz(spec_agg, http, SLOW_FRONTEND, SLOW_WORKER)


@pytest.mark.parametrize("stream", [False, True])
def test_line_separators_in_generated_text_reach_the_client_intact(spec_agg: Deployment, stream: bool) -> None:
    """Found by the fault tests' random text: U+0085 and U+2028 are line breaks to ``str.splitlines``
    (so to httpx's ``aiter_lines``) but not to JSON, so the worker's NDJSON must be split on ``\\n`` only."""
    text = "one\x85two\u2028three\u2029four\x1cfive"
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", timeout=60, json={
        "model": s.MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream, "max_tokens": 64,
        "logits_processors": [{"kind": "forced_text", "text": text}]})
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: {")]
        assert not any("error" in e for e in events), events
        assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == text
    else:
        assert r.json()["choices"][0]["message"]["content"] == text
