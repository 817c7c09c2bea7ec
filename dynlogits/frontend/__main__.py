"""``python -m dynlogits.frontend --agg-worker URL`` (or ``--prefill-worker``/``--decode-worker``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dynlogits.specs import SpecError
from dynlogits.worker.args import load_deployment_config

from .args import parse_frontend_args


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 2 on a bad logits config."""
    import uvicorn

    from .app import FrontendState, create_app
    from .metrics import FrontendMetrics
    from .routing import Router

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness probe otherwise
    args = parse_frontend_args(argv)
    try:
        config = load_deployment_config(args.logits_spec, args.allow_request_kinds)
    except SpecError as err:
        print(f"dynlogits.frontend: invalid logits config: {err}", file=sys.stderr)
        return 2
    router = Router({"agg": args.agg_workers, "prefill": args.prefill_workers, "decode": args.decode_workers},
                    health_interval_s=args.health_interval_s)
    app = create_app(FrontendState(router=router, config=config, metrics=FrontendMetrics(),
                                   max_body_bytes=args.max_body_bytes))
    # Keep-alive longer than clients keep idle connections (httpx, so the openai SDK: 5 s), so a
    # client never reuses a connection the frontend is closing at that moment.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10,
                timeout_keep_alive=75)
    return 0


if __name__ == "__main__":
    sys.exit(main())
