"""How much one engine-side process keeps after realizing many distinct large payloads.

    .venv/bin/python tests/sdk/memory_probe.py --payloads 500 [--threads 4] [--trim]

Realizes ``--payloads`` distinct payloads (``dynlogits.sdk.realize(payload, vocab_size=1000,
stop_token_id=0)``: decoding, the width and consistency checks, the processors and the tables they
share), on ``--threads`` threads as an engine's several threads would, drops every request, and
prints one JSON line: the process's RSS before (after one warm-up payload) and after, in MiB, and
the bytes each per-process memo holds (``Kept.held``). ``--trim`` calls glibc's ``malloc_trim(0)``
before reading the RSS after. The environment (``MALLOC_ARENA_MAX``) is the caller's.

The payloads are large but cheap to admit, and distinct each time (ids salted by the index): even
ones a ``banned_tokens`` of 760 ids and 6 ``banned_phrases`` of 256 phrases of 64 tokens, odd ones
the ``banned_tokens`` and 7 ``multiple_choice`` of 255 choices of 64 tokens that share one choice
(about 1 MB of JSON each). ``tests/sdk/test_realization.py`` runs it (``heavy``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VOCAB = 1000


def large_payload(index: int) -> list[dict[str, Any]]:
    """Payload ``index`` (the same index, the same payload): banned ids below 761, phrases of them,
    choices of the ids above, each choice set sharing its first choice so their entries agree."""
    rng = random.Random(index)
    ids = lambda low, high, n: [rng.randrange(low, high) for _ in range(n)]  # noqa: E731
    entries: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": rng.sample(range(1, 761), 760)}]
    if index % 2 == 0:
        entries += [{"kind": "banned_phrases", "phrases": [ids(1, 761, 64) for _ in range(256)]} for _ in range(6)]
    else:
        common = [999, *ids(800, 999, 63)]
        entries += [{"kind": "multiple_choice", "eos_token_id": 0,
                     "choices": [common] + [[770 + k, *ids(800, 999, 63)] for _ in range(254)]} for k in range(7)]
    return entries


def rss_mib() -> float:
    """This process's resident set (``VmRSS``), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def realize_one(index: int) -> None:
    from dynlogits import sdk

    request = sdk.realize(large_payload(index), vocab_size=VOCAB, stop_token_id=0)
    if request is None or request.failed:
        raise RuntimeError(f"payload {index} did not realize: {request and request.error}")


def memos_held() -> dict[str, int]:
    """The bytes every per-process memo holds (``Kept.held``)."""
    from dynlogits.processors import banned_phrases, multiple_choice
    from dynlogits.sdk import realization

    return {"decoded": realization._decoded_memo.held, "checked": realization._checked_memo.held,
            "multiple_choice": multiple_choice._TABLES.held, "banned_phrases": banned_phrases._TABLES.held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before the RSS after")
    args = parser.parse_args()
    realize_one(-2)  # warm-up: imports, the kinds, torch's first allocations
    realize_one(-1)
    gc.collect()
    before = rss_mib()
    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(realize_one, range(args.payloads)))
    seconds = time.perf_counter() - start
    gc.collect()
    if args.trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    after = rss_mib()
    print(json.dumps({"payloads": args.payloads, "threads": args.threads, "trim": args.trim, "seconds": round(seconds, 1),
                      "rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
                      "growth_mib": round(after - before, 1), "held": memos_held()}))


if __name__ == "__main__":
    main()
