"""Shared by tests/dynamo: NVIDIA Dynamo deployments started with the real launch scripts.

No ``__init__.py`` here on purpose: a ``tests/dynamo`` package would shadow the real ``dynamo``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:  # tests/deploy is a package: its launcher starts launch/*.sh
    sys.path.insert(0, str(ROOT / "tests"))

from deploy.launcher import PYTHON, Deployment, free_port_block, wait_until  # noqa: E402

__all__ = ["HELLO", "MODEL", "PYTHON", "ROOT", "Deployment", "free_port_block", "dynamo_deployment", "generate_tokens", "openai_client"]

HELLO = "Hello world!"
MODEL = "dynlogits-tiny"
#: Two workers and a frontend on a shared 2-core machine: be generous.
READY_TIMEOUT = 900


def low_port_block(n: int) -> int:
    """A free block below 32768: Dynamo 1.6.1 parses a worker's system port as a signed 16-bit int."""
    import random
    import socket

    for _ in range(500):
        base = random.randrange(20000, 32768 - n)
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port block below 32768")


def dynamo_deployment(name: str, *, workers: int = 1, args: list[str] | None = None,
                      env: dict[str, str] | None = None) -> Deployment:
    """``launch/agg.sh --runtime dynamo`` started and ready (every worker routed to)."""
    d = Deployment(name, "agg.sh", low_port_block(1 + workers),
                   args=["--runtime", "dynamo", "--workers", str(workers), *(args or [])],
                   env={"DYN_READY_TIMEOUT": str(READY_TIMEOUT), "DYN_ENABLE_TEST_LOGITS_PROCESSOR": "0", **(env or {})})
    d.start(timeout=READY_TIMEOUT)
    try:  # the frontend's /health answers before the workers serve; the script says when they do
        wait_until(lambda: "dynlogits: ready:" in d.log_tail(400), READY_TIMEOUT, f"{name} workers")
    except BaseException:
        d.stop(signal.SIGTERM)
        raise
    return d


def openai_client(d: Deployment) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=d.base_url, api_key="unused", max_retries=0, timeout=120)


def generate_tokens(d: Deployment, token_ids: list[int], sampling_params: dict[str, Any]) -> Any:
    """Dynamo's token-level route (``POST /inference/v1/generate``), which carries ``extra_args``."""
    import httpx

    return httpx.post(f"{d.url}/inference/v1/generate", timeout=120,
                      json={"model": MODEL, "token_ids": token_ids, "sampling_params": sampling_params})
