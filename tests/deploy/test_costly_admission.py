"""Admission's cost is bounded and paid where the request enters, through ``launch/agg.sh`` with the
default limits (``open_agg``) and the real ``openai`` client for the normal requests.

The costly payload is the load tool's (``dynlogits.tools.load.costly.costly_payload``): a 760-id
ban, 6 phrases of 64 tokens and 7 choices of 255 x 64 tokens, distinct each time. Before the
admission work budget its consistency walks took seconds, three times per request (the worker's
event loop, vLLM's input validation in the same process, the engine's model runner), so normal
clients waited behind it and the frontend took the stalled worker out of rotation (503s)."""

from __future__ import annotations

import itertools
from collections import Counter

import httpx
import pytest

from dynlogits.tools.load.costly import costly_payload

from .abuse import MODEL, Abuse, assert_prompt, latencies_during
from .launcher import Deployment

pytestmark = pytest.mark.engine

COSTLY_CLIENTS = 4


def _costly_body(index: int) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Costly {index}."}], "max_tokens": 4,
            "temperature": 0, "logits_processors": costly_payload(index)}


def test_a_payload_over_the_admission_work_budget_is_refused_naming_the_budget_and_its_field(
        open_agg: Deployment) -> None:
    r = httpx.post(f"{open_agg.base_url}/chat/completions", json=_costly_body(1), timeout=120)
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert "(limit max_admission_work)" in error["message"], error
    assert error["param"].startswith("logits_processors["), error


def test_normal_requests_stay_prompt_while_clients_send_distinct_costly_payloads(open_agg: Deployment) -> None:
    """Four clients, each from its own address, send distinct costly payloads over and over while a
    normal client sends short chats: the normal ones answer promptly and none of them, nor any
    costly one, gets a 5xx."""
    turn = itertools.count()
    clients = [httpx.Client(transport=httpx.HTTPTransport(local_address=f"127.0.0.{70 + i}"), timeout=120)
               for i in range(COSTLY_CLIENTS)]

    def attack() -> int:
        i = next(turn)
        return clients[i % COSTLY_CLIENTS].post(f"{open_agg.base_url}/chat/completions", json=_costly_body(i)).status_code

    try:
        latencies, outcomes = latencies_during(Abuse(attack, threads=COSTLY_CLIENTS), open_agg,
                                               under_way=COSTLY_CLIENTS)
    finally:
        for client in clients:
            client.close()
    statuses = Counter(outcomes)
    assert set(statuses) <= {200, 400}, statuses
    assert_prompt(latencies, f"costly payloads ({sum(statuses.values())} sent: {dict(statuses)})")
