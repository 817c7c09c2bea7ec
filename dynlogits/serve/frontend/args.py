"""Command-line flags of ``python -m dynlogits.serve.frontend``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dynlogits.policy.config import split_kinds
from dynlogits.serve.http.bearer_auth import BearerKeys, read_key_file
from dynlogits.serve.http.bodies import DEFAULT_MAX_BODY_BYTES
from dynlogits.serve.http.heads import HeadLimits, add_head_limit_flags, head_limits_from_flags
from dynlogits.serve.limits import RequestLimits, add_limit_flags, limits_from_flags
from dynlogits.serve.secret import add_worker_secret_flag, worker_secret_from_flags

from .identity import ClientIdentity, TrustedProxies

__all__ = ["IDLE_TIMEOUT_ENV", "FrontendArgs", "ServerLimits", "parse_frontend_args"]

IDLE_TIMEOUT_ENV = "DYN_WORKER_IDLE_TIMEOUT"


@dataclass(frozen=True)
class ServerLimits:
    """How long a client may take and how much of the engine it may hold (docs/reliability.md,
    "Limits"). Each has a flag and a ``DYN_`` environment variable (the launch scripts pass the
    environment on to every process)."""

    #: Seconds for a request's head (request line and headers) to arrive; then 408 and close.
    header_timeout_s: float = 10.0
    #: Seconds for a request's whole body to arrive; then 408 and close.
    body_timeout_s: float = 30.0
    #: Seconds a streaming client may take no data before its stream is ended and its request aborted.
    send_timeout_s: float = 60.0
    #: Open connections; beyond it the one idle or slow the longest is closed to make room.
    max_connections: int = 1024
    #: Sequences (``n`` per request) in flight across all clients; vLLM's ``max_num_seqs`` default.
    max_inflight_sequences: int = 128
    #: Sequences one client may have in flight or waiting; beyond it, 429.
    max_client_sequences: int = 96
    #: Seconds a request may wait for capacity; then 429.
    queue_timeout_s: float = 30.0
    #: CPU (ms) a client's request bodies may cost per second, sustained (``.pacing``); beyond its
    #: burst its next request waits before its body is read, or gets 429 past ``queue_timeout_s``.
    client_cpu_ms_per_s: float = 50.0
    #: CPU (ms) a client's bodies may cost at once before its requests are paced.
    client_cpu_burst_ms: float = 100.0
    #: Header naming the client for ``max_client_sequences`` (an authenticating proxy's user header);
    #: empty: the client's address. Ignored when API keys are configured (a client is its key).
    client_id_header: str = ""


#: flag -> (ServerLimits field, environment variable, type)
_SERVER_FLAGS: dict[str, tuple[str, str, type]] = {
    "--header-timeout": ("header_timeout_s", "DYN_HEADER_TIMEOUT", float),
    "--body-timeout": ("body_timeout_s", "DYN_BODY_TIMEOUT", float),
    "--send-timeout": ("send_timeout_s", "DYN_SEND_TIMEOUT", float),
    "--max-connections": ("max_connections", "DYN_MAX_CONNECTIONS", int),
    "--max-inflight-sequences": ("max_inflight_sequences", "DYN_MAX_INFLIGHT_SEQUENCES", int),
    "--max-client-sequences": ("max_client_sequences", "DYN_MAX_CLIENT_SEQUENCES", int),
    "--queue-timeout": ("queue_timeout_s", "DYN_QUEUE_TIMEOUT", float),
    "--client-cpu-ms-per-s": ("client_cpu_ms_per_s", "DYN_CLIENT_CPU_MS_PER_S", float),
    "--client-cpu-burst-ms": ("client_cpu_burst_ms", "DYN_CLIENT_CPU_BURST_MS", float),
    "--client-id-header": ("client_id_header", "DYN_CLIENT_ID_HEADER", str),
}


def _add_server_flags(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    group = p.add_argument_group("client limits (default: $DYN_<NAME>, else the built-in value)")
    defaults = ServerLimits()
    for flag, (name, env, kind) in _SERVER_FLAGS.items():
        default = getattr(defaults, name)
        raw = environ.get(env)
        if raw is not None and raw.strip() != "":
            try:
                default = kind(raw.strip())
            except ValueError:
                p.error(f"{env}: must be a {kind.__name__}, got {raw!r}")
        group.add_argument(flag, dest=name, type=kind, default=default, metavar={float: "S", int: "N"}.get(kind, "NAME"),
                           help=f"(${env}, default {default!r})")


def _server_limits(p: argparse.ArgumentParser, ns: argparse.Namespace) -> ServerLimits:
    limits = ServerLimits(**{name: getattr(ns, name) for name, _, _ in _SERVER_FLAGS.values()})
    for flag, (name, env, kind) in _SERVER_FLAGS.items():
        value = getattr(limits, name)
        if kind is not str and not value > 0:
            p.error(f"{flag} (${env}): must be > 0, got {value}")
    if limits.max_client_sequences > limits.max_inflight_sequences:
        p.error(f"--max-client-sequences ({limits.max_client_sequences}) must be at most --max-inflight-sequences "
                f"({limits.max_inflight_sequences}): one client could otherwise take every sequence")
    return limits


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
    #: A request whose worker sends nothing for this long ends with 504 and the worker is taken
    #: out of rotation until it answers a readiness probe again.
    worker_idle_timeout_s: float = 60.0
    #: After SIGTERM the frontend takes no new connections and lets in-flight requests run this long;
    #: then their connections are closed (the client sees the connection end mid-response).
    graceful_timeout_s: float = 10.0
    server: ServerLimits = field(default_factory=ServerLimits)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    head_limits: HeadLimits = field(default_factory=HeadLimits)
    #: API keys, trusted proxies and the client header: who a client is (``.identity``).
    identity: ClientIdentity = field(default_factory=ClientIdentity)
    #: Sent to every worker as a bearer token (``dynlogits.serve.secret``); ``None``: none.
    worker_secret: str | None = field(default=None, repr=False)


API_KEY_ENV, API_KEY_FILE_ENV = "DYN_API_KEY", "DYN_API_KEY_FILE"
TRUSTED_PROXIES_ENV, FORWARDED_HEADER_ENV = "DYN_TRUSTED_PROXIES", "DYN_FORWARDED_HEADER"


def _add_access_flags(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    group = p.add_argument_group("who may call, and who a client is (docs/reliability.md, \"Client identity\")")
    group.add_argument("--api-key", action="append", default=[], metavar="KEY",
                       help=f"an API key clients must send as 'Authorization: Bearer KEY' on /v1/ routes (repeat for "
                            f"several; also ${API_KEY_ENV}); a command line is visible to other local users, so "
                            "prefer --api-key-file")
    group.add_argument("--api-key-file", default=environ.get(API_KEY_FILE_ENV) or None, metavar="FILE",
                       help=f"API keys, one per line (${API_KEY_FILE_ENV})")
    group.add_argument("--trusted-proxies", default=environ.get(TRUSTED_PROXIES_ENV, ""), metavar="ADDRS",
                       help="comma-separated addresses or networks of proxies whose forwarding header names the "
                            f"client (${TRUSTED_PROXIES_ENV}, default: none, the peer address is the client)")
    group.add_argument("--forwarded-header", default=environ.get(FORWARDED_HEADER_ENV) or "x-forwarded-for",
                       metavar="NAME", help="the header those proxies append the client's address to: "
                                            f"x-forwarded-for or forwarded (${FORWARDED_HEADER_ENV}, default "
                                            "x-forwarded-for)")
    add_worker_secret_flag(p, environ)


def _identity(p: argparse.ArgumentParser, ns: argparse.Namespace, environ: Mapping[str, str],
              server: ServerLimits) -> ClientIdentity:
    keys = list(ns.api_key)
    if environ.get(API_KEY_ENV, "").strip():
        keys.append(environ[API_KEY_ENV].strip())
    try:
        if ns.api_key_file:
            keys += read_key_file(ns.api_key_file)
        api_keys = BearerKeys(keys)
    except ValueError as err:
        p.error(f"--api-key-file / --api-key (${API_KEY_FILE_ENV} / ${API_KEY_ENV}): {err}")
    try:
        proxies = TrustedProxies.parse(ns.trusted_proxies, ns.forwarded_header)
    except ValueError as err:
        p.error(f"--trusted-proxies / --forwarded-header (${TRUSTED_PROXIES_ENV} / ${FORWARDED_HEADER_ENV}): {err}")
    return ClientIdentity(api_keys=api_keys, proxies=proxies, client_id_header=server.client_id_header)


def _urls(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for v in values or () for u in v.split(",") if u.strip())


def parse_frontend_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> FrontendArgs:
    """Parse and check ``argv``; exits with a usage error when the worker set is incomplete or a
    limit (flag or ``DYN_`` variable) is invalid."""
    p = argparse.ArgumentParser(prog="python -m dynlogits.serve.frontend",
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
    p.add_argument("--worker-idle-timeout", type=float, default=float(os.environ.get(IDLE_TIMEOUT_ENV, 60.0)),
                   help="seconds a worker may send nothing (no headers, no chunk) before its request ends "
                        f"with 504 and the worker is taken out of rotation until it answers again (${IDLE_TIMEOUT_ENV}, "
                        "default 60)")
    p.add_argument("--graceful-timeout", type=float, default=10.0, metavar="S",
                   help="seconds in-flight requests may run after SIGTERM before their connections are closed "
                        "(default 10)")
    add_limit_flags(p, environ)
    _add_server_flags(p, environ)
    add_head_limit_flags(p, environ)
    _add_access_flags(p, environ)
    ns = p.parse_args(argv)
    if not ns.graceful_timeout > 0:
        p.error(f"--graceful-timeout: must be > 0, got {ns.graceful_timeout}")
    agg, prefill, decode = _urls(ns.agg_worker), _urls(ns.prefill_worker), _urls(ns.decode_worker)
    if agg and (prefill or decode):
        p.error("use either --agg-worker or --prefill-worker/--decode-worker, not both")
    if not agg and not (prefill and decode):
        p.error("need --agg-worker, or both --prefill-worker and --decode-worker")
    server = _server_limits(p, ns)
    return FrontendArgs(host=ns.host, port=ns.port, agg_workers=agg, prefill_workers=prefill, decode_workers=decode,
                        logits_spec=ns.logits_spec, allow_request_kinds=split_kinds(ns.allow_request_kinds),
                        health_interval_s=ns.health_interval, max_body_bytes=ns.max_body_bytes,
                        worker_idle_timeout_s=ns.worker_idle_timeout, graceful_timeout_s=ns.graceful_timeout,
                        server=server, request_limits=limits_from_flags(ns), head_limits=head_limits_from_flags(ns),
                        identity=_identity(p, ns, environ, server),
                        worker_secret=worker_secret_from_flags(p, ns, environ))
