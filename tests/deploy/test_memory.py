"""What a deployment keeps after clients send many distinct large payloads, through ``launch/agg.sh``
with the default limits (``open_agg``): the worker and its engine processes together grow by at
most 256 MiB (docs/reliability.md, "Per process": every memo is bounded in bytes).

The payloads are ``tests/sdk/memory_probe.py``'s (``large_payload``), large but within the default
admission work budget and distinct each time: even ones a 760-id ban and 6 ``banned_phrases`` of 256
phrases of 64 tokens (~0.5 MB of JSON), odd ones the ban and a ``multiple_choice`` of 255 choices of
32 tokens; 4 clients send them at once. Memory is the worker's own reading of its process tree
(``/stats`` ``rss_by_process``: the worker, vLLM's engine core and its model runner).

    .venv/bin/pytest tests/deploy/test_memory.py -m engine -s   # DYN_MEMORY_PAYLOADS=500 by default
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from .abuse import MODEL, normal_latencies
from .launcher import Deployment, settled_stats

pytestmark = [pytest.mark.engine, pytest.mark.heavy]

PAYLOADS = int(os.environ.get("DYN_MEMORY_PAYLOADS", "500"))
CLIENTS = 4
#: docs/reliability.md: what the worker and its engine processes may keep beyond what they held
GROWTH_BUDGET = 256 << 20


def _probe() -> Any:
    spec = importlib.util.spec_from_file_location("memory_probe", Path(__file__).parents[1] / "sdk" / "memory_probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rss(d: Deployment) -> dict[str, int]:
    """Resident bytes of the worker and of each of its engine processes, once no request is in flight."""
    stats = settled_stats(d.worker_url())
    rss = stats.get("rss_by_process")
    assert rss, f"the worker's /stats reports no memory: {stats}"
    return dict(rss)


def test_distinct_large_payloads_grow_the_worker_and_its_engine_by_at_most_256_mib(open_agg: Deployment) -> None:
    large_payload = _probe().large_payload
    normal_latencies(open_agg, 4)  # warm: the worker and the engine have served requests
    before = _rss(open_agg)
    turn = itertools.count()
    clients = [httpx.Client(transport=httpx.HTTPTransport(local_address=f"127.0.0.{90 + i}"), timeout=300)
               for i in range(CLIENTS)]

    def send(_: int) -> int:
        i = next(turn)
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Large {i}."}], "max_tokens": 2,
                "temperature": 0, "logits_processors": large_payload(10_000 + i)}
        return clients[i % CLIENTS].post(f"{open_agg.base_url}/chat/completions", json=body).status_code

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = Counter(pool.map(send, range(PAYLOADS)))
    finally:
        for client in clients:
            client.close()
    after = _rss(open_agg)
    mib = lambda rss: {title: round(size / 2**20) for title, size in rss.items()}  # noqa: E731
    growth = sum(after.values()) - sum(before.values())
    figures = (f"{PAYLOADS} distinct large payloads ({dict(statuses)}): RSS {mib(before)} -> {mib(after)} MiB, "
               f"{growth / 2**20:+.0f} MiB in all")
    print(figures)  # noqa: T201 - the figure docs/reliability.md quotes (pytest -s)
    assert statuses == Counter({200: PAYLOADS}), figures  # admitted and realized: else nothing was measured
    assert growth <= GROWTH_BUDGET, figures
