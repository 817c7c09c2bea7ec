"""Command-line flags of ``python -m dynlogits.frontend``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from dynlogits.untrusted import DEFAULT_MAX_BODY_BYTES
from dynlogits.worker.args import split_kinds

__all__ = ["FrontendArgs", "parse_frontend_args"]


@dataclass(frozen=True)
class FrontendArgs:
    """Parsed frontend flags. Either ``agg_workers`` or both ``prefill_workers`` and
    ``decode_workers`` are non-empty."""

    host: str
    port: int
    agg_workers: tuple[str, ...]
    prefill_workers: tuple[str, ...]
    decode_workers: tuple[str, ...]
    logits_spec: str | None
    allow_request_kinds: frozenset[str]
    health_interval_s: float
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def _urls(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for v in values or () for u in v.split(",") if u.strip())


def parse_frontend_args(argv: Sequence[str] | None = None) -> FrontendArgs:
    """Parse and check ``argv``; exits with a usage error when the worker set is incomplete."""
    p = argparse.ArgumentParser(prog="python -m dynlogits.frontend",
                                description="OpenAI-compatible frontend routing to dynlogits workers.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--agg-worker", action="append", help="URL of an aggregated worker (repeat or comma-separate)")
    p.add_argument("--prefill-worker", action="append", help="URL of a prefill worker (disaggregated)")
    p.add_argument("--decode-worker", action="append", help="URL of a decode worker (disaggregated)")
    p.add_argument("--logits-spec", default=None, help="operator config file (YAML/JSON); else $DYN_LOGITS_SPEC")
    p.add_argument("--allow-request-kinds", default="", help="comma-separated kinds clients may send per request")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between worker readiness probes")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies are refused with 413 before they are read in full")
    ns = p.parse_args(argv)
    agg, prefill, decode = _urls(ns.agg_worker), _urls(ns.prefill_worker), _urls(ns.decode_worker)
    if agg and (prefill or decode):
        p.error("use either --agg-worker or --prefill-worker/--decode-worker, not both")
    if not agg and not (prefill and decode):
        p.error("need --agg-worker, or both --prefill-worker and --decode-worker")
    return FrontendArgs(host=ns.host, port=ns.port, agg_workers=agg, prefill_workers=prefill, decode_workers=decode,
                        logits_spec=ns.logits_spec, allow_request_kinds=split_kinds(ns.allow_request_kinds),
                        health_interval_s=ns.health_interval, max_body_bytes=ns.max_body_bytes)
