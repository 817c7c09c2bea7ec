"""Command-line flags of ``python -m dynlogits.serve.worker``; unknown flags go to the engine."""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynlogits.policy.config import split_kinds
from dynlogits.policy.roles import DisaggregationMode
from dynlogits.serve.http.heads import HeadLimits, add_head_limit_flags, head_limits_from_flags
from dynlogits.serve.limits import RequestLimits, add_limit_flags, limits_from_flags, positive_int
from dynlogits.serve.secret import WORKER_SECRET_ENV, add_worker_secret_flag, worker_secret_from_flags

__all__ = ["BACKENDS", "WorkerArgs", "is_loopback", "parse_worker_args"]

BACKENDS = ("vllm", "sglang")  # sglang: dynlogits.serve.worker.sglang_engine (needs a GPU host)
#: Served name of the embedded default model.
DEFAULT_MODEL_NAME = "dynlogits-tiny"


@dataclass(frozen=True)
class WorkerArgs:
    """Parsed worker flags. ``model`` is ``None`` for the embedded default model."""

    backend: str = "vllm"
    model: str | None = None
    served_model_name: str | None = None
    disaggregation_mode: DisaggregationMode = DisaggregationMode.AGGREGATED
    host: str = "127.0.0.1"
    port: int = 8100
    logits_spec: str | None = None
    allow_request_kinds: frozenset[str] = frozenset()
    graceful_timeout_s: float = 10.0
    engine_args: tuple[str, ...] = field(default_factory=tuple)
    #: Per-request bounds checked before tokenization (``$DYN_MAX_STOP_SEQUENCES`` ... or the flags).
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    #: Seconds a ``/generate`` body may take to arrive (``$DYN_BODY_TIMEOUT``); then 408.
    body_timeout_s: float = 30.0
    #: Seconds a request head may take to arrive (``$DYN_HEADER_TIMEOUT``); then 408 and close.
    header_timeout_s: float = 10.0
    #: Open connections (``$DYN_WORKER_MAX_CONNECTIONS``); beyond it the idle or slow one is shed.
    #: Above the frontend's own pool (1024 connections), so a frontend's streams are never shed.
    max_connections: int = 2048
    #: Sequences (``n`` per request) in flight on this worker (``$DYN_WORKER_MAX_INFLIGHT_SEQUENCES``);
    #: beyond it ``/generate`` answers 429. Above a frontend's own bound (128), so that one frontend's
    #: queued requests always fit; it bounds what several frontends, or any other caller, may start.
    max_inflight_sequences: int = 256
    head_limits: HeadLimits = field(default_factory=HeadLimits)
    #: Required as a bearer token on every route but ``/health`` (``dynlogits.serve.secret``).
    worker_secret: str | None = field(default=None, repr=False)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dynlogits.serve.worker",
        description="Serve one engine behind dynlogits' internal worker API. "
                    "Flags not listed here are passed to the engine (e.g. --dtype float32).",
    )
    p.add_argument("--backend", choices=BACKENDS, default="vllm", help="engine backend (vllm; sglang needs SGLang with its GPU dependencies)")
    p.add_argument("--model", default=None, help="model path or name (default: the embedded tiny model)")
    p.add_argument("--served-model-name", default=None, help="name clients use (default: --model, or dynlogits-tiny)")
    p.add_argument("--disaggregation-mode", choices=[m.value for m in DisaggregationMode if m.value != "encode"],
                   default="agg", help="role of this worker")
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1: the port is for the deployment's frontend only; another "
                        f"address needs a worker secret, ${WORKER_SECRET_ENV} or --worker-secret-file)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--logits-spec", default=None, help="operator config file (YAML/JSON); else $DYN_LOGITS_SPEC")
    p.add_argument("--allow-request-kinds", default="", help="comma-separated kinds clients may send per request")
    p.add_argument("--graceful-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may run after SIGTERM before they are aborted")
    add_limit_flags(p)
    p.add_argument("--body-timeout", type=_seconds, default=_env_seconds("DYN_BODY_TIMEOUT", 30.0, p), metavar="S",
                   help="seconds a /generate body may take to arrive before a 408 ($DYN_BODY_TIMEOUT, default 30)")
    p.add_argument("--header-timeout", type=_seconds, default=_env_seconds("DYN_HEADER_TIMEOUT", 10.0, p), metavar="S",
                   help="seconds a request head may take to arrive before a 408 ($DYN_HEADER_TIMEOUT, default 10)")
    p.add_argument("--max-connections", type=positive_int, default=_env_count("DYN_WORKER_MAX_CONNECTIONS", 2048, p),
                   metavar="N", help="open connections; beyond it the one idle or slow the longest is closed "
                                     "($DYN_WORKER_MAX_CONNECTIONS, default 2048)")
    p.add_argument("--max-inflight-sequences", type=positive_int,
                   default=_env_count("DYN_WORKER_MAX_INFLIGHT_SEQUENCES", 256, p), metavar="N",
                   help="sequences (n per request) in flight on this worker; beyond it /generate answers 429 "
                        "($DYN_WORKER_MAX_INFLIGHT_SEQUENCES, default 256)")
    add_head_limit_flags(p)
    add_worker_secret_flag(p, os.environ)
    return p


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the port to this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _env_count(name: str, default: int, p: argparse.ArgumentParser) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return positive_int(raw) if raw else default
    except argparse.ArgumentTypeError as err:
        p.error(f"{name}: {err}")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _env_seconds(name: str, default: float, p: argparse.ArgumentParser) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not value > 0:
        p.error(f"{name}: must be a number of seconds > 0, got {raw!r}")
    return value


def parse_worker_args(argv: Sequence[str] | None = None) -> WorkerArgs:
    """Parse ``argv``; the unknown rest becomes ``engine_args`` (validated by the engine)."""
    p = _parser()
    ns, rest = p.parse_known_args(argv)
    secret = worker_secret_from_flags(p, ns, os.environ)
    if secret is None and not is_loopback(ns.host):
        p.error(f"--host {ns.host} exposes the worker beyond this machine: set a worker secret "
                f"(${WORKER_SECRET_ENV} or --worker-secret-file) shared with the frontend")
    return WorkerArgs(
        backend=ns.backend,
        model=ns.model,
        served_model_name=ns.served_model_name,
        disaggregation_mode=DisaggregationMode(ns.disaggregation_mode),
        host=ns.host,
        port=ns.port,
        logits_spec=ns.logits_spec,
        allow_request_kinds=split_kinds(ns.allow_request_kinds),
        graceful_timeout_s=ns.graceful_timeout,
        engine_args=tuple(rest),
        request_limits=limits_from_flags(ns),
        body_timeout_s=ns.body_timeout,
        header_timeout_s=ns.header_timeout,
        max_connections=ns.max_connections,
        max_inflight_sequences=ns.max_inflight_sequences,
        head_limits=head_limits_from_flags(ns),
        worker_secret=secret,
    )
