"""How much one engine-side process keeps after realizing many distinct large payloads.

    .venv/bin/python tests/sdk/memory_probe.py --payloads 500 [--threads 4] [--window 4] [--trim]

Realizes ``--payloads`` distinct payloads (``dynlogits.sdk.realize(payload, vocab_size=1000,
stop_token_id=0)``: decoding, the width and consistency checks, the processors and the tables they
share), on ``--threads`` threads, each keeping its last ``--window`` requests alive as an engine's
batch does, drops every request, and
prints one JSON line: the process's RSS before (after one warm-up payload) and after, in MiB, and
the bytes each per-process memo holds (``Kept.held``). ``--trim`` then calls glibc's ``malloc_trim(0)``
and reads it again. The environment (``MALLOC_ARENA_MAX``) is the caller's.

The payloads (``large_payload``) are large but cheap to admit, and distinct each time (ids drawn
from a generator seeded with the index); ``tests/sdk/test_realization.py`` (``heavy``) and
``tests/deploy/test_memory.py`` send them.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VOCAB = 1000


def large_payload(index: int) -> list[dict[str, Any]]:
    """Payload ``index`` (the same index, the same payload): a ban of 760 ids (8-767: 0-7 are the
    embedded model's special tokens), then 6 ``banned_phrases`` of 256 phrases of 64 of those ids
    (even ``index``, ~0.5 MB of JSON) or one ``multiple_choice`` of 255 choices of 32 ids above them
    (odd). Large, yet within the default admission work budget: phrases and choices never meet."""
    rng = random.Random(index)
    ids = lambda low, high, n: [rng.randrange(low, high) for _ in range(n)]  # noqa: E731
    entries: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": rng.sample(range(8, 768), 760)}]
    if index % 2 == 0:
        entries += [{"kind": "banned_phrases", "phrases": [ids(8, 768, 64) for _ in range(256)]} for _ in range(6)]
    else:
        entries.append({"kind": "multiple_choice", "eos_token_id": 0, "choices": [ids(770, 1000, 32) for _ in range(255)]})
    return entries


def rss_mib() -> float:
    """This process's resident set (``VmRSS``), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def realize_one(index: int) -> Any:
    """Payload ``index``'s request, realized (``RuntimeError`` if it failed)."""
    from dynlogits import sdk

    request = sdk.realize(large_payload(index), vocab_size=VOCAB, stop_token_id=0)
    if request is None or request.failed:
        raise RuntimeError(f"payload {index} did not realize: {request and request.error}")
    return request


def realize_all(indices: range, window: int) -> None:
    """Realize every payload of ``indices``, ``window`` requests alive at a time (an engine's batch)."""
    batch: deque[Any] = deque(maxlen=window)
    for index in indices:
        batch.append(realize_one(index))


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
    parser.add_argument("--window", type=int, default=1, help="requests alive at a time, per thread")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before the RSS after")
    args = parser.parse_args()
    realize_one(-2)  # warm-up: imports, the kinds, torch's first allocations
    realize_one(-1)
    gc.collect()
    before = rss_mib()
    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(realize_all, (range(t, args.payloads, args.threads) for t in range(args.threads)),
                      [args.window] * args.threads))
    seconds = time.perf_counter() - start
    gc.collect()
    after = rss_mib()
    trimmed = {}
    if args.trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = {"rss_trimmed_mib": round(rss_mib(), 1), "growth_trimmed_mib": round(rss_mib() - before, 1)}
    print(json.dumps({"payloads": args.payloads, "threads": args.threads, "window": args.window, "seconds": round(seconds, 1),
                      "rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
                      "growth_mib": round(after - before, 1), **trimmed, "held": memos_held()}))


if __name__ == "__main__":
    main()
