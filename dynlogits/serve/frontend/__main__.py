"""``python -m dynlogits.serve.frontend --agg-worker URL`` (or ``--prefill-worker``/``--decode-worker``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dynlogits.policy.config import load_deployment_config
from dynlogits.specs import SpecError

from .args import parse_frontend_args


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 2 on a bad logits config."""
    import uvicorn

    from dynlogits.serve.http.connections import guarded_protocol
    from dynlogits.serve.http.protocol_errors import ProtocolErrorLog

    from .app import FrontendState, create_app
    from .client_guard import ClientGuard, ClientGuardMiddleware
    from .metrics import FrontendMetrics
    from .routing import Router

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness probe otherwise
    args = parse_frontend_args(argv)
    try:
        config = load_deployment_config(args.logits_spec, args.allow_request_kinds)
    except SpecError as err:
        print(f"dynlogits.serve.frontend: invalid logits config: {err}", file=sys.stderr)
        return 2
    router = Router({"agg": args.agg_workers, "prefill": args.prefill_workers, "decode": args.decode_workers},
                    health_interval_s=args.health_interval_s, idle_timeout_s=args.worker_idle_timeout_s,
                    worker_secret=args.worker_secret)
    metrics = FrontendMetrics()
    app = create_app(FrontendState(router=router, config=config, metrics=metrics,
                                   max_body_bytes=args.max_body_bytes, worker_secret=args.worker_secret))
    protocol_errors = ProtocolErrorLog(logging.getLogger("dynlogits.serve.frontend"),
                                       on_error=lambda kind: metrics.protocol_errors.labels(kind=kind).inc())
    # Client limits (docs/reliability.md, "Limits"): API keys, per-request bounds and the fair queue in
    # the app, stalled readers and ticket release around it, request heads and connections in the protocol.
    guard = ClientGuard(request_limits=args.request_limits, server=args.server, metrics=metrics,
                        identity=args.identity, protocol_errors=protocol_errors)
    protocol = guarded_protocol(header_timeout_s=args.server.header_timeout_s, head_limits=args.head_limits,
                                max_connections=args.server.max_connections, on_close=guard.closed,
                                protocol_errors=protocol_errors)
    # Keep-alive longer than clients keep idle connections (httpx, so the openai SDK: 5 s), so a
    # client never reuses a connection the frontend is closing at that moment. No proxy headers:
    # who a client is comes from .identity (X-Forwarded-For only from the listed proxies); no
    # WebSocket; no ``server`` header.
    uvicorn.run(ClientGuardMiddleware(app, guard), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=args.graceful_timeout_s,  # type: ignore[arg-type]  # uvicorn waits with asyncio's float timeout; it annotates int
                timeout_keep_alive=75, http=protocol, proxy_headers=False, server_header=False, ws="none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
