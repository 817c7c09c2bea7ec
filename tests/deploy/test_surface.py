"""The HTTP surface of a real deployment, as a hostile client sees it (``launch/agg.sh`` with
``examples/deployment.yaml``, the shared ``spec_agg``; the real ``openai`` client and raw sockets):

* request heads over their limits are refused on the frontend's and the worker's port alike (431,
  414), and the frontend keeps no memory for them (24-90 MB heads used to be answered 200, and 127 of
  them grew the frontend by 1.8 GiB);
* a client that names itself in ``X-Forwarded-For`` / ``Forwarded`` gets no more than one client's
  share (each spoofed value used to count as a new client);
* with API keys, a request without one is a 401 and the share is per key;
* the worker port answers a caller without the deployment's secret with 401 (it used to generate for
  anyone), its ``/stats`` and ``/ready`` included, listens on loopback only, and bounds the sequences
  in flight itself;
* malformed chunked bodies cost a few log lines in all (a 48-line traceback each before), and are
  counted;
* the public ``/health`` names no worker URL or probe error, no answer carries a ``server`` header,
  and an error quotes only a short prefix of what the client sent.

While each abuse runs, normal requests keep answering (median within 2 s, each within 15 s: see
``abuse.py``). The extra frontends here run in front of ``spec_agg``'s worker, so no engine is
started for this file. Figures: docs/reliability.md ("The surface").
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from .abuse import MODEL, Abuse, UnreadStreams, assert_prompt, latencies_during, normal_latencies, open_unread_stream, send_unread
from .conftest import SPEC_FILE
from .launcher import WORKER_AUTH, Deployment, extra_frontend, settled_stats, wait_until

pytestmark = pytest.mark.engine

#: One client's share: ``max_client_sequences`` (96) in streams of 16 samples.
SHARE_STREAMS = 96 // 16
KEYS = ["sk-surface-alice-0123456789", "sk-surface-bob-0123456789"]
#: ``DYN_WORKER_MAX_INFLIGHT_SEQUENCES`` of ``spec_agg``'s worker (``conftest.py``).
WORKER_CAP = 144


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def front(spec_agg: Deployment) -> Iterator[Deployment]:
    """A frontend with the default limits (no trusted proxy) in front of spec_agg's worker."""
    with extra_frontend("surface", "--agg-worker", spec_agg.worker_url(1), "--logits-spec", str(SPEC_FILE)) as url:
        yield Deployment("surface", "agg.sh", _port(url))  # only its URLs are used


@pytest.fixture(scope="module")
def keyed(spec_agg: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The same with two API keys, from a file."""
    key_file = tmp_path_factory.mktemp("surface") / "keys"
    key_file.write_text("\n".join(KEYS) + "\n")
    with extra_frontend("surface-keyed", "--agg-worker", spec_agg.worker_url(1), "--logits-spec", str(SPEC_FILE),
                        "--api-key-file", str(key_file)) as url:
        yield Deployment("surface-keyed", "agg.sh", _port(url))


def _huge_head(port: int, size: int = 24 << 20) -> str:
    """One header line of ``size`` bytes, written whole before reading; the status answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nx-big: ")
        try:
            for _ in range(size >> 20):
                s.sendall(b"z" * (1 << 20))
            s.sendall(b"\r\n\r\n")
        except OSError:
            pass
        return s.recv(12)[9:12].decode()


def test_oversized_heads_are_refused_on_both_ports_and_the_frontend_keeps_no_memory(spec_agg: Deployment) -> None:
    frontend = spec_agg.named("dynlogits.serve.frontend")[0]
    ports = itertools.cycle([spec_agg.port, _port(spec_agg.worker_url(1))])
    start = frontend.memory_info().rss
    latencies, statuses = latencies_during(Abuse(lambda: _huge_head(next(ports)), threads=4), spec_agg, under_way=8)
    grown = frontend.memory_info().rss - start
    assert set(statuses) == {"431"}, statuses
    assert_prompt(latencies, f"{len(statuses)} heads of 24 MiB on both ports (all 431); frontend RSS "
                             f"{start >> 20} -> {(start + grown) >> 20} MiB")
    assert grown < 50 * 2**20, grown


def _spoofed() -> dict[str, str]:
    hop = next(_HOPS)
    return {"X-Forwarded-For": f"198.51.100.{hop % 250}", "Forwarded": f"for=203.0.113.{hop % 250}"}


_HOPS = itertools.count()


def test_spoofed_forwarded_for_admits_no_more_streams_than_one_client(front: Deployment,
                                                                      spec_agg: Deployment) -> None:
    """50 never-read streams of 16 samples from 127.0.0.1 (where a local proxy connects from), each
    naming a different client in ``X-Forwarded-For`` and ``Forwarded``: one client's share is
    admitted, no more, and a client at another address (127.0.0.2) is served meanwhile."""
    abuse = UnreadStreams(front.port, headers=_spoofed, source="127.0.0.1")
    latencies = _share_held_while(abuse, front, lambda **kw: normal_latencies(front, source="127.0.0.2", **kw))
    assert_prompt(latencies, f"spoofed X-Forwarded-For on 50 unread streams (at most {SHARE_STREAMS} at a time)")
    settled_stats(spec_agg.worker_url(1), timeout=60)


def _share_held_while(abuse: UnreadStreams, front: Deployment, measure: Callable[..., list[float]]) -> list[float]:
    """``measure(before_each=...)`` once ``abuse`` holds its share and every one of its 50 threads has
    been refused at least once. Before each normal request the frontend's sequences in flight are
    read: never more than one share (a stream whose whole answer fit in the socket buffers ends, and
    the abuser is admitted another, so the count of 200s alone may exceed a share)."""
    seen: list[float] = []

    def in_flight() -> None:
        text = httpx.get(f"{front.url}/metrics", timeout=30).text
        seen.append(next(float(line.split()[-1]) for line in text.splitlines()
                         if line.startswith("dynlogits_inflight_sequences ")))

    try:
        wait_until(lambda: abuse.statuses["200"] >= SHARE_STREAMS and abuse.statuses["429"] >= 50, 120,
                   "the abuse to fill its share")
        latencies = measure(before_each=in_flight)
    finally:
        statuses = abuse.stop()
    assert set(statuses) <= {"200", "429"}, statuses
    assert max(seen) <= SHARE_STREAMS * 16, seen
    return latencies


def test_with_api_keys_a_request_without_one_is_a_401_and_the_share_is_per_key(keyed: Deployment,
                                                                                spec_agg: Deployment) -> None:
    """Alice fills her share with never-read streams; Bob, from the same address (127.0.0.1), is not
    counted in it: his requests answer promptly. Without a key, or with a wrong one: 401."""
    for key in (None, "sk-wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        _, status = open_unread_stream(keyed.port, headers)
        assert status == "401", key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.base_url, api_key="sk-wrong", max_retries=0).models.list()
    alice = UnreadStreams(keyed.port, headers=lambda: {"Authorization": f"Bearer {KEYS[0]}"}, source="127.0.0.1")
    latencies = _share_held_while(alice, keyed, lambda **kw: normal_latencies(keyed, api_key=KEYS[1], **kw))
    assert_prompt(latencies, f"another key's 50 unread streams (at most {SHARE_STREAMS} at a time)")
    settled_stats(spec_agg.worker_url(1), timeout=60)


@pytest.mark.parametrize(("method", "path"), [("POST", "/generate"), ("GET", "/stats"), ("GET", "/ready"),
                                              ("GET", "/docs")])
@pytest.mark.parametrize("auth", [None, "Bearer wrong-secret-0123456789", "Basic x"], ids=["none", "wrong", "basic"])
def test_the_worker_port_answers_a_caller_without_the_secret_with_401(spec_agg: Deployment, method: str, path: str,
                                                                      auth: str | None) -> None:
    body = {"request_id": "x", "prompt": "Hi", "sampling": {"max_tokens": 4}} if method == "POST" else None
    r = httpx.request(method, spec_agg.worker_url(1) + path, json=body, timeout=30,
                      headers={"Authorization": auth} if auth else {})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_worker_secret", r.text
    assert "pid" not in r.text and "allow_request_kinds" not in r.text


def test_generation_asked_of_the_worker_port_without_the_secret_costs_nothing(spec_agg: Deployment) -> None:
    """Four clients asking the worker port for 16 samples of 480 tokens over and over (a normal request
    took 26 s while this ran before): each a 401 before any work, and normal requests answer."""
    stats = f"{spec_agg.worker_url(1)}/stats"
    before = httpx.get(stats, headers=WORKER_AUTH, timeout=30).json()["requests"]
    body = {"request_id": "x", "prompt": "Hi", "sampling": {"max_tokens": 480, "n": 16, "ignore_eos": True}}
    abuse = Abuse(lambda: httpx.post(spec_agg.worker_url(1) + "/generate", json=body, timeout=60).status_code,
                  threads=4)
    latencies, outcomes = latencies_during(abuse, spec_agg, under_way=8)
    statuses = Counter(outcomes)
    assert set(statuses) == {401}, statuses
    assert httpx.get(stats, headers=WORKER_AUTH, timeout=30).json()["requests"] == before + len(latencies)
    assert_prompt(latencies, f"{sum(statuses.values())} generate calls at the worker port without the secret (all 401)")


def test_the_worker_port_is_loopback_only_and_open_only_for_liveness(spec_agg: Deployment) -> None:
    worker = spec_agg.named("dynlogits.serve.worker")[0]
    listening = {c.laddr.ip for c in worker.net_connections(kind="inet") if c.status == "LISTEN"}
    assert listening == {"127.0.0.1"}, listening
    r = httpx.get(spec_agg.worker_url(1) + "/health", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"} and "server" not in r.headers
    stats = httpx.get(spec_agg.worker_url(1) + "/stats", timeout=30, headers=WORKER_AUTH)
    assert stats.status_code == 200 and stats.json()["pid"] == worker.pid and "server" not in stats.headers


def test_the_worker_keeps_its_own_inflight_cap(spec_agg: Deployment) -> None:
    """A caller holding the secret (say, a second frontend) sends streams of 16 samples straight to the
    worker: those within the worker's cap are taken, the next is a 429 naming the limit. An unread
    stream is not held for ever: the loopback's buffers take all 16 x 2,000 tokens (1.6 MB), which
    the embedded model generates in about 2 s alone, longer 144 sequences at a time. So the next
    request goes out as soon as the count reaches the cap (480 tokens once ended first in CI)."""
    body = {"request_id": "cap", "prompt": "Hi", "sampling": {"max_tokens": 2000, "n": 16, "ignore_eos": True}}
    worker, stats = spec_agg.worker_url(1), f"{spec_agg.worker_url(1)}/stats"

    def in_flight() -> int:
        return httpx.get(stats, headers=WORKER_AUTH, timeout=30).json()["in_flight_sequences"]

    # Earlier tests' streams gone first, so the cap is all this test's: a sequence still in flight
    # from them had one of these streams refused, and the count never reached the cap (CI, once).
    before = settled_stats(worker, timeout=120)
    assert before["in_flight_sequences"] == 0, before
    held: list[socket.socket] = []
    try:
        for _ in range(WORKER_CAP // 16):
            held.append(send_unread(_port(worker), WORKER_AUTH, path="/generate", body=body))
        wait_until(lambda: in_flight() == WORKER_CAP, 60, "the streams to be taken", interval=0.02)
        r = httpx.post(f"{worker}/generate", json=body, headers=WORKER_AUTH, timeout=60)
        assert r.status_code == 429 and "(limit max_inflight_sequences)" in r.json()["error"]["message"], r.text
        assert r.headers["retry-after"] == "1"
    finally:
        for s in held:
            s.close()
    settled = settled_stats(worker, timeout=60)
    assert settled["in_flight_sequences"] == 0 and settled["refused_capacity"] >= 1, settled


def _malformed_chunked(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
                  b"\r\n5\r\n{\"a\":\r\nzz\r\n" % path.encode())
        return s.recv(12)[9:12].decode()


def test_malformed_chunked_bodies_add_at_most_a_few_log_lines(spec_agg: Deployment) -> None:
    """200 malformed chunked bodies at the frontend and 200 at the worker, while normal requests run:
    each a 400 (401 where the worker refused the caller first), each counted, a handful of log lines."""
    mark = spec_agg.log_size()
    metric = 'dynlogits_client_protocol_errors_total{kind="invalid_http"}'

    def counted() -> float:
        text = httpx.get(f"{spec_agg.url}/metrics", timeout=30).text
        return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(metric + " ")), 0.0)

    def worker_counted() -> int:
        stats = httpx.get(f"{spec_agg.worker_url(1)}/stats", timeout=30, headers=WORKER_AUTH).json()
        return stats["protocol_errors"].get("invalid_http", 0)

    before, worker_before = counted(), worker_counted()
    targets = [(spec_agg.port, "/v1/chat/completions"), (_port(spec_agg.worker_url(1)), "/generate")]
    statuses: list[str] = []

    def send(target: tuple[int, str]) -> None:
        statuses.extend(_malformed_chunked(*target) for _ in range(100))

    threads = [threading.Thread(target=send, args=(targets[i % 2],), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    latencies = normal_latencies(spec_agg)
    for t in threads:
        t.join(timeout=120)
    assert len(statuses) == 400 and set(statuses) <= {"400", "401"}, Counter(statuses)
    wait_until(lambda: counted() - before >= 200, 30, "the frontend to count them", interval=0.2)
    assert worker_counted() - worker_before >= 1
    with open(spec_agg.log_path, "rb") as log:  # type: ignore[arg-type]
        log.seek(mark)
        added = log.read().decode(errors="replace").splitlines()
    assert len(added) <= 6 and not any("Traceback" in line for line in added), added
    assert_prompt(latencies, f"400 malformed chunked bodies at both ports ({len(added)} log lines)")


def test_the_public_health_names_no_worker_url_and_the_secret_shows_them(spec_agg: Deployment) -> None:
    public = httpx.get(f"{spec_agg.url}/health", timeout=30)
    assert public.json() == {"status": "ok", "workers": [{"role": "agg", "ready": True}]}
    assert "server" not in public.headers and "127.0.0.1" not in public.text
    detailed = httpx.get(f"{spec_agg.url}/health", timeout=30, headers=WORKER_AUTH).json()
    assert detailed["workers"][0]["url"] == spec_agg.worker_url(1)


def test_errors_quote_only_a_short_prefix_of_what_was_sent(spec_agg: Deployment) -> None:
    word = "hello world " * 170  # 2,040 characters, 341 tokens (over max_phrase_tokens): refused, naming the word
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "bad_words": [word]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words[0]", r.text
    message = r.json()["error"]["message"]
    assert "limit max_phrase_tokens" in message and word[:64] not in message and len(message) < 400, message
    model = "m" * 100_000
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", timeout=60,
                   json={"model": model, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404 and len(r.text) < 1000, r.text[:300]
    key = "k" * 100_000
    raw = f'{{"model": "{MODEL}", "messages": [], "{key}": 1, "{key}": 2}}'
    r = httpx.post(f"{spec_agg.base_url}/chat/completions", content=raw.encode(), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "duplicate key" in r.text and len(r.text) < 1000, r.text[:300]
