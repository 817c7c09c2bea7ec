"""Hostile load on a real deployment: while each abuse runs, normal requests (the real ``openai``
client) keep answering promptly (median within 2 s, each within 15 s), and no abusive request gets a 5xx.

* oversized work (100,000 stop strings, ~3.9 MB prompts, ``n * max_tokens`` beyond the limit, at
  the frontend and straight at the worker): refused with a 400 naming the field and the limit before
  any work (it used to be tokenized or scanned in full, stalling everyone for up to 25 s);
* slow clients (bodies trickled a byte a second, heads never finished, more connections than the
  cap): cut off by the head and body deadlines with a 408, shed at the cap (they stayed open for ever);
* one client opening 50 streams of 16 samples of 480 tokens and never reading them: it gets its
  share (96 sequences: 6 streams) and a 429 for the rest (normal requests used to time out).

The frontend under test is a second frontend process in front of the shared ``spec_agg`` worker,
with the default limits except short deadlines (2 s head, 3 s body, 2 s send) so the test does not
wait the defaults (10 s, 30 s, 60 s). The abusive client of the fairness test connects from
``127.0.0.66``, a different peer address than the normal client's ``127.0.0.1`` (the frontend tells
clients apart by peer address by default). Figures measured by these tests are in docs/reliability.md ("Limits").
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .abuse import MODEL, Abuse, UnreadStreams, assert_prompt, latencies_during, normal_latencies
from .launcher import ROOT, WORKER_AUTH, Deployment, extra_frontend, settled_stats, wait_until

pytestmark = pytest.mark.engine

HEAD_S, BODY_S, SEND_S, MAX_CONNECTIONS = 2.0, 3.0, 2.0, 64


@pytest.fixture(scope="module")
def hostile(spec_agg: Deployment) -> Iterator[Deployment]:
    """A frontend with the default client limits but short head, body and send deadlines, before
    spec_agg's worker."""
    env = {"DYN_HEADER_TIMEOUT": str(HEAD_S), "DYN_BODY_TIMEOUT": str(BODY_S), "DYN_SEND_TIMEOUT": str(SEND_S),
           "DYN_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    with extra_frontend("hostile", "--agg-worker", spec_agg.worker_url(1), "--logits-spec",
                        str(ROOT / "examples" / "deployment.yaml"), env=env) as url:
        yield Deployment("hostile", "agg.sh", int(url.rsplit(":", 1)[1]))  # only its URLs are used


# --- item 2: oversized work ----------------------------------------------------------------------

BIG_TEXT = "ab " * 1_300_000  # 3.9 MB
ABUSES = {  # (path, body, param, limit)
    "100,000 stop strings": ("/v1/chat/completions", {"stop": [f"s{i:06d}" for i in range(100_000)]}, "stop",
                             "max_stop_sequences"),
    "a 3.9 MB chat prompt": ("/v1/chat/completions", {"messages": [{"role": "user", "content": BIG_TEXT}]},
                             "messages", "max_prompt_chars"),
    "a 3.9 MB text prompt": ("/v1/completions", {"prompt": BIG_TEXT}, "prompt", "max_prompt_chars"),
    "n=16 of 4,000 tokens": ("/v1/chat/completions", {"n": 16, "max_tokens": 4000}, "max_tokens",
                             "max_request_tokens"),
}
WORKER_ABUSES = {
    "100,000 stop strings": ({"prompt": "Hi", "sampling": {"stop": [f"s{i:06d}" for i in range(100_000)]}},
                             "sampling.stop", "max_stop_sequences"),
    "a 3.9 MB prompt": ({"prompt": BIG_TEXT}, "prompt", "max_prompt_chars"),
    "a 3.9 MB chat prompt": ({"messages": [{"role": "user", "content": BIG_TEXT}]}, "messages", "max_prompt_chars"),
}


def test_oversized_work_is_refused_by_name_before_any_work(hostile: Deployment, spec_agg: Deployment) -> None:
    stats = f"{spec_agg.worker_url(1)}/stats"
    before = httpx.get(stats, timeout=30, headers=WORKER_AUTH).json()["requests"]
    for name, (path, fields, param, limit) in ABUSES.items():
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **fields}
        r = httpx.post(f"{hostile.url}{path}", json=body, timeout=60)
        assert r.status_code == 400, (name, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == param and f"(limit {limit})" in error["message"], (name, error)
    for name, (fields, param, limit) in WORKER_ABUSES.items():
        r = httpx.post(f"{spec_agg.worker_url(1)}/generate", json={"request_id": "big", **fields}, timeout=60,
                       headers=WORKER_AUTH)
        assert r.status_code == 400, (name, r.text[:300])
        assert r.json()["error"]["param"] == param and f"(limit {limit})" in r.json()["error"]["message"], name
    assert httpx.get(stats, timeout=30, headers=WORKER_AUTH).json()["requests"] == before  # no engine request was made


def test_normal_requests_stay_prompt_while_oversized_work_is_sent(hostile: Deployment, spec_agg: Deployment) -> None:
    """Four clients each sending 100,000 stop strings (1 MB bodies) and three sending 3.9 MB prompts,
    over and over, to the frontend and straight to the worker."""
    bodies = [json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                          "stop": [f"s{i:06d}" for i in range(100_000)]}).encode(),
              json.dumps({"model": MODEL, "messages": [{"role": "user", "content": BIG_TEXT}]}).encode()]
    worker_bodies = [json.dumps({"request_id": "big", **fields}).encode() for fields, _, _ in WORKER_ABUSES.values()]
    turn = iter(range(10**9))

    def attack() -> int:
        i = next(turn)
        if i % 3 == 2:
            url, body = f"{spec_agg.worker_url(1)}/generate", worker_bodies[i % len(worker_bodies)]
        else:
            url, body = f"{hostile.base_url}/chat/completions", bodies[i % 2]
        return httpx.post(url, content=body, headers={"content-type": "application/json", **WORKER_AUTH},
                          timeout=60).status_code

    latencies, outcomes = latencies_during(Abuse(attack, threads=7), hostile, under_way=7)
    statuses = Counter(outcomes)
    assert set(statuses) == {400}, statuses
    assert_prompt(latencies, f"oversized work ({sum(statuses.values())} abusive requests, all 400)")


# --- item 4: slow clients ------------------------------------------------------------------------


def _slow_client(port: int, kind: str, outcome: dict[str, Any], deadline_s: float) -> None:
    """``head``: a head that never ends (one more header line a second); ``body``: a body sent a byte
    a second. Records what the server answered and how long the connection lasted.

    It sends only until 0.7 s before the server's ``deadline_s``, then waits: a byte that reached
    the server after its close would reset the connection, and the kernel drops the 408 unread."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        if kind == "head":
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n")
        else:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: 60\r\n\r\n{")
        reply = b""
        s.settimeout(1.0)
        while time.monotonic() - started < 60:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                if time.monotonic() - started >= deadline_s - 0.7:
                    continue
                try:
                    s.send(b"x-more: 1\r\n" if kind == "head" else b" ")  # a little more, a second later
                except OSError:
                    break
                continue
            except OSError:
                break
            if not chunk:
                break
            reply += chunk
    outcome.update(status=reply[9:12].decode() if reply else None, seconds=time.monotonic() - started)


def test_slow_clients_are_cut_off_and_normal_requests_stay_prompt(hostile: Deployment) -> None:
    """Ten clients trickling bodies a byte a second and ten that never finish their heads."""
    outcomes: list[dict[str, Any]] = [{"kind": "body"} for _ in range(10)] + [{"kind": "head"} for _ in range(10)]
    threads = [threading.Thread(target=_slow_client,
                                args=(hostile.port, o["kind"], o, HEAD_S if o["kind"] == "head" else BODY_S),
                                daemon=True) for o in outcomes]
    for t in threads:
        t.start()
    latencies = normal_latencies(hostile)
    for t in threads:
        t.join(timeout=60)
    for o in outcomes:
        deadline = HEAD_S if o["kind"] == "head" else BODY_S
        assert o.get("status") == "408" and o["seconds"] < deadline + 3, o
    assert_prompt(latencies, "10 slow bodies and 10 unfinished heads")


def test_the_worker_port_cuts_off_a_head_that_never_ends(spec_agg: Deployment) -> None:
    """The worker's own server has the frontend's head deadline (default 10 s): a client that reaches
    the worker port directly cannot hold a connection for ever by never finishing its head."""
    outcome: dict[str, Any] = {}
    _slow_client(int(spec_agg.worker_url(1).rsplit(":", 1)[1]), "head", outcome, 10.0)
    assert outcome.get("status") == "408", outcome
    assert outcome["seconds"] < 10 + 5, outcome  # the default deadline, plus a busy machine's delay


def _closed_at_the_cap(d: Deployment) -> float:
    """Connections the frontend has closed at its connection cap (shed or refused), from its metrics."""
    text = httpx.get(f"{d.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynlogits_connections_closed_total{") and 'reason="connection_limit_' in line)


def test_a_connection_flood_beyond_the_cap_does_not_lock_out_a_live_client(hostile: Deployment) -> None:
    """Twice the cap of unfinished heads: the oldest idle ones are shed (the frontend's metrics count
    at least the excess), and normal requests stay prompt."""
    cap_before = _closed_at_the_cap(hostile)
    flood = [socket.create_connection(("127.0.0.1", hostile.port), timeout=10) for _ in range(2 * MAX_CONNECTIONS)]
    try:
        for s in flood:
            s.sendall(b"GET /health HTTP/1.1\r\n")  # heads left unfinished
        latencies = normal_latencies(hostile)
    finally:
        for s in flood:
            s.close()
    assert_prompt(latencies, f"{2 * MAX_CONNECTIONS} unfinished connections (cap {MAX_CONNECTIONS})")
    assert _closed_at_the_cap(hostile) - cap_before >= MAX_CONNECTIONS


# --- item 5: one client cannot take the engine ---------------------------------------------------

def test_one_client_cannot_take_the_engine(hostile: Deployment, spec_agg: Deployment) -> None:
    """50 never-read streams of 16 samples from one client: 6 at a time (96 sequences, its share)
    run, the rest get 429 at once; the engine keeps room for everyone else, whose requests stay
    prompt. (Without the share, its 800 sequences filled vLLM's 128 slots and everyone else queued
    behind them: normal requests timed out after 20 s.) The abuser's 50 connections and its held
    streams come near the frontend's cap of 64 (connections it has just been refused on may not be
    closed yet on a busy machine): a connection closed at the cap reads no status (``""``), and
    the frontend's metrics count each one."""
    stats = f"{spec_agg.worker_url(1)}/stats"
    before = httpx.get(stats, timeout=30, headers=WORKER_AUTH).json()["requests"]
    cap_before = _closed_at_the_cap(hostile)

    def abuse_in_flight() -> None:
        """Until the engine holds at least 3 of the abuser's streams (48 sequences; 96 is its share): each
        normal request is sent while the abuse generates, not while its streams wait for their reader."""
        wait_until(lambda: (httpx.get(stats, timeout=30, headers=WORKER_AUTH).json()["adapter_requests"] or 0) >= 48, 60,
                   "the abuse to generate", 0.2)

    abuse = UnreadStreams(hostile.port)
    try:
        wait_until(lambda: abuse.statuses["200"] >= 6 and abuse.statuses["429"] >= 44, 60, "the abuse to start")
        latencies = normal_latencies(hostile, before_each=abuse_in_flight)
    finally:
        statuses = abuse.stop()
    assert set(statuses) <= {"200", "429", ""}, statuses  # never a 5xx
    assert statuses[""] <= _closed_at_the_cap(hostile) - cap_before, statuses  # no status: closed at the cap only
    admitted_during = httpx.get(stats, timeout=30, headers=WORKER_AUTH).json()["requests"] - before - len(latencies)
    assert admitted_during == statuses["200"]
    metrics = httpx.get(f"{hostile.url}/metrics", timeout=30).text
    assert f'dynlogits_requests_refused_total{{reason="client_share"}} {float(statuses["429"])}' in metrics
    assert_prompt(latencies, f"one client's never-read streams of 16 x 480 tokens ({statuses['200']} admitted, "
                             f"{statuses['429']} refused)")
    settled = settled_stats(spec_agg.worker_url(1), timeout=60)
    assert settled["in_flight"] == 0 and settled["adapter_requests"] == 0, settled
