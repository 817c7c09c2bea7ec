"""``python -m dynlogits.serve.worker [flags] [engine flags]``: see ``--help``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from types import FrameType

from dynlogits.policy.config import load_deployment_config
from dynlogits.specs import SpecError

from .args import parse_worker_args

#: Seconds uvicorn waits beyond the drain deadline, for the in-band errors of the requests the
#: deadline ended to reach their clients, before it cancels what is left.
DRAIN_GRACE_S = 5


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 2 on a bad config, 1 when the engine cannot start, 3 when it died."""
    import asyncio

    import uvicorn

    from dynlogits.serve.http.connections import guarded_protocol
    from dynlogits.serve.secret import WORKER_SECRET_ENV

    from .app import ENGINE_DEAD_EXIT, WorkerState, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_worker_args(argv)
    try:
        config = load_deployment_config(args.logits_spec, args.allow_request_kinds)
    except SpecError as err:
        print(f"dynlogits.serve.worker: invalid logits config: {err}", file=sys.stderr)
        return 2
    state = WorkerState(args=args, config=config)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # /ready and new /generate calls answer 503 at once; in-flight requests get until the
            # drain deadline (--graceful-timeout), then end with an in-band error.
            if not state.draining:
                state.draining = True
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(state.drain, args.graceful_timeout_s)
            super().handle_exit(sig, frame)

    if args.worker_secret is None:
        logging.getLogger("dynlogits.serve.worker").warning(
            "no worker secret (%s): any local process can call this worker; the launch scripts set one",
            WORKER_SECRET_ENV)
    # The same head limits, head deadline and connection cap as the frontend's (dynlogits.serve.http.connections):
    # the secret keeps others from this port's routes, not from its parser.
    protocol = guarded_protocol(header_timeout_s=args.header_timeout_s, max_connections=args.max_connections,
                                head_limits=args.head_limits, protocol_errors=state.protocol_errors)
    server = Server(uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning",
                                   timeout_graceful_shutdown=int(args.graceful_timeout_s) + DRAIN_GRACE_S,
                                   http=protocol, proxy_headers=False, server_header=False, ws="none"))

    def fatal() -> None:
        server.should_exit = True

    state.on_fatal = fatal
    server.run()
    if state.engine_dead:
        return ENGINE_DEAD_EXIT
    return 1 if state.start_error else 0


if __name__ == "__main__":
    sys.exit(main())
