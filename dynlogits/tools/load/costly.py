"""Costly clients: each sends, in a loop, distinct payloads that are as costly to admit as the default
limits allow, from its own client identity, while the normal load runs.

The payload (``costly_payload``) is the hostile mix of issue 47: a ``banned_tokens`` of 760 ids, 6
``banned_phrases`` of 64 tokens and 7 ``multiple_choice`` entries of 255 choices of 64 tokens
(about 1 MB of JSON), its ids salted by the request index so no memo can answer it. A deployment
either refuses it (400: the admission work budget) or admits it; either way the normal clients'
latency must not suffer (``--costly-clients``: ``python -m dynlogits.tools.load``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["CostlyOutcome", "costly_payload", "run_costly_clients"]

#: Ids the payload draws from: inside the embedded model's 1,000-token vocabulary, above its
#: special tokens.
_ID_RANGE = (8, 1000)


def costly_payload(index: int, *, choices: int = 7, phrases: int = 6, banned: int = 760) -> list[dict[str, Any]]:
    """The payload of costly request ``index`` (the same index, the same payload; another, another).

    Its choices are 64 tokens of one id ``a`` with another id ``c`` at some of 8 positions
    near their start (255 choices: every pattern but none, so the trie has ~14,000 nodes per entry), and
    each phrase is a long run of ``a`` ending in an id no choice writes: the choices stay writable,
    and a walk back from every node of the trie follows the run: unbounded, its admission would
    cost seconds of CPU (docs/reliability.md, "Admission", has the measured figures)."""
    rng = random.Random(index)
    low, high = _ID_RANGE
    a, c, *tails = rng.sample(range(low, high), 2 + phrases)
    rest = [t for t in range(low, high) if t not in {a, c, *tails}]
    offset = rng.randrange(0, 8)
    entries: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": sorted(rng.sample(rest, banned))}]
    entries += [{"kind": "banned_phrases", "phrases": [[a] * (63 - k) + [tail]]} for k, tail in enumerate(tails)]
    patterns = [[c if offset <= b < offset + 8 and j >> (b - offset) & 1 else a for b in range(64)] for j in range(1, 256)]
    entries += [{"kind": "multiple_choice", "choices": patterns, "eos_token_id": 0} for _ in range(choices)]
    return entries


@dataclass
class CostlyOutcome:
    """What the costly clients got: answers by HTTP status (200, 400, ...; 0: no answer) and latencies."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())


def _source_address(base_url: str, client: int) -> str | None:
    """A loopback source address of its own for costly client ``client`` (the frontend tells clients
    apart by peer address), when the deployment is on loopback; else ``None`` (the default route)."""
    host = urlsplit(base_url).hostname or ""
    return f"127.0.0.{20 + client}" if host == "localhost" or host.startswith("127.") else None


async def _one_client(base_url: str, model: str, client: int, stop: asyncio.Event, outcome: CostlyOutcome,
                      timeout_s: float) -> None:
    import httpx

    local = _source_address(base_url, client)
    transport = httpx.AsyncHTTPTransport(local_address=local) if local else httpx.AsyncHTTPTransport()
    url = f"{base_url.rstrip('/')}/chat/completions"
    async with httpx.AsyncClient(transport=transport, timeout=timeout_s) as http:
        index = client * 1_000_000
        while not stop.is_set():
            body = {"model": model, "messages": [{"role": "user", "content": f"Costly request {index}."}],
                    "max_tokens": 4, "temperature": 0.0, "logits_processors": costly_payload(index)}
            started = time.perf_counter()
            try:
                status = (await http.post(url, json=body)).status_code
            except httpx.HTTPError:
                status = 0
            outcome.statuses[status] += 1
            outcome.latencies_ms.append((time.perf_counter() - started) * 1000)
            index += 1


async def run_costly_clients(base_url: str, model: str, clients: int, stop: asyncio.Event, *,
                             timeout_s: float) -> CostlyOutcome:
    """Run ``clients`` costly clients until ``stop`` is set (each finishes the request in hand)."""
    outcome = CostlyOutcome()
    await asyncio.gather(*(_one_client(base_url, model, c, stop, outcome, timeout_s) for c in range(clients)))
    return outcome
