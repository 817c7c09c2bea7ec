"""``python -m dynlogits.tools.load``: see ``--help``. Exit status 0 only when every request was answered right."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .costly import run_costly_clients
from .deployment import LaunchedDeployment, worker_settled, worker_stats
from .driver import Answer, judge, print_progress, run_load
from .plan import Mix, Plan, TokenPair, build_plans, load_token_pair
from .report import CostlyReport, Summary, WorkerSnapshot, summarize

EMBEDDED_MODEL = "dynlogits-tiny"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynlogits.tools.load", description=__doc__)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    target.add_argument("--launch", action="store_true", help="start launch/agg.sh on free ports, stop it after")
    p.add_argument("--launch-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for launch/agg.sh (repeat), e.g. --launch-arg=--max-model-len=1024")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at once (default 64)")
    p.add_argument("--requests", type=int, default=512, help="requests to send, warm-up excluded (default 512)")
    p.add_argument("--warmup", type=int, default=None, help="unchecked requests sent first (default: --concurrency)")
    p.add_argument("--mix", default="forced=2,banned=1,bias=1,none=1",
                   help="relative weights of the kinds forced, banned, bias, none (default %(default)s)")
    p.add_argument("--stream-share", type=float, default=0.5, help="fraction of requests that stream (default 0.5)")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens per bias/banned/none answer (default 4)")
    p.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    p.add_argument("--tokenizer", default=None,
                   help="folder with the served model's tokenizer.json, for the bias/banned kinds "
                        "(default: the embedded model's, when the model is dynlogits-tiny)")
    p.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    p.add_argument("--costly-clients", type=int, default=0, metavar="K",
                   help="K clients, each from its own address, sending distinct payloads as costly to admit as the "
                        "default limits allow, in a loop; the requests are then sent twice, alone and beside them, "
                        "and the report holds the normal clients' p99 to 2x its value alone + 1 s (default 0)")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write the summary as JSON")
    return p


def _tokens(mix: Mix, model: str, tokenizer: str | None) -> TokenPair | None:
    if not mix.needs_tokens:
        return None
    if tokenizer is None and model == EMBEDDED_MODEL:
        from dynlogits.model_builder import default_model_dir

        tokenizer = str(default_model_dir())
    if tokenizer is None:
        raise ValueError(f"the kinds banned/bias need --tokenizer DIR for model {model!r} (or leave them out of --mix)")
    return load_token_pair(tokenizer)


async def _drive(base_url: str, model: str | None, plans: list[Plan], warmup: list[Plan], args: argparse.Namespace,
                 launched: LaunchedDeployment | None) -> tuple[str, list[Answer], float, dict[str, Any]]:
    import httpx
    from openai import AsyncOpenAI

    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=args.concurrency + 8,
                                                 max_keepalive_connections=args.concurrency + 8))
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=args.timeout,
                           http_client=http) as client:  # type: ignore[arg-type]  # openai's stubs name its vendored httpx
        if model is None:
            model = (await client.models.list()).data[0].id
        if warmup:
            warm = await run_load(client, warmup, model=model, concurrency=args.concurrency, timeout_s=args.timeout)
            failed = sum(a.error is not None for a in warm)
            print(f"[load] warm-up: {len(warm)} requests, {failed} failed", file=sys.stderr, flush=True)
        before: dict[str, Any] = {"workers": await asyncio.to_thread(worker_stats, base_url),
                                  "frontend_rss": launched.frontend_rss() if launched else None}
        if args.costly_clients:
            print(f"[load] the requests alone, before the {args.costly_clients} costly clients start",
                  file=sys.stderr, flush=True)
            before["alone"] = await run_load(client, plans, model=model, concurrency=args.concurrency,
                                             timeout_s=args.timeout, progress=print_progress(len(plans)))
            plans = [dataclasses.replace(p, index=p.index + 2 * 10**6) for p in plans]
        stop = asyncio.Event()
        costly = asyncio.create_task(run_costly_clients(base_url, model, args.costly_clients, stop,
                                                        timeout_s=args.timeout))
        started = time.perf_counter()
        try:
            answers = await run_load(client, plans, model=model, concurrency=args.concurrency, timeout_s=args.timeout,
                                     progress=print_progress(len(plans)))
        finally:
            stop.set()
            before["costly"] = await costly
        return model, answers, time.perf_counter() - started, before


def _settled_stats(base_url: str, wait_s: float = 15) -> dict[str, dict[str, Any]]:
    """Worker stats once every worker has settled (``worker_settled``: requests the client gave up
    on may still be aborting), or the last read after ``wait_s`` s."""
    deadline = time.monotonic() + wait_s
    while True:
        stats = worker_stats(base_url)
        if all(map(worker_settled, stats.values())) or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def run(args: argparse.Namespace, base_url: str, launched: LaunchedDeployment | None = None) -> Summary:
    """Plan, warm up, send, judge and summarize (the deployment at ``base_url`` is already up)."""
    mix = Mix.parse(args.mix)
    model = args.model
    if model is None and mix.needs_tokens:
        import httpx

        model = httpx.get(f"{base_url.rstrip('/')}/models", timeout=30).json()["data"][0]["id"]
    tokens = _tokens(mix, model or "", args.tokenizer)
    warmup_n = args.concurrency if args.warmup is None else args.warmup
    common = {"stream_share": args.stream_share, "max_tokens": args.max_tokens, "tokens": tokens}
    warmup = build_plans(warmup_n, mix, start=10**6, **common)
    plans = build_plans(args.requests, mix, **common)
    model, answers, duration, before = asyncio.run(_drive(base_url, model, plans, warmup, args, launched))
    after = _settled_stats(base_url)
    summary = summarize(answers, judge(answers), base_url=base_url, model=model, concurrency=args.concurrency,
                        duration_s=duration)
    if args.costly_clients:
        summary.costly = CostlyReport.of(args.costly_clients, before["alone"], answers, before["costly"])
    if launched is not None:
        summary.frontend_rss_bytes_before, summary.frontend_rss_bytes_after = before["frontend_rss"], \
            launched.frontend_rss()
    for url, stats in after.items():
        old = before["workers"].get(url, {})
        summary.workers.append(WorkerSnapshot(
            url=url, pid=stats.get("pid"), rss_bytes_before=old.get("rss_bytes"), rss_bytes_after=stats.get("rss_bytes"),
            rss_by_process_before=old.get("rss_by_process") or {}, rss_by_process_after=stats.get("rss_by_process") or {},
            in_flight_after=stats.get("in_flight"), adapter_requests_after=stats.get("adapter_requests"),
            requests_served=(stats["requests"] - old["requests"]) if "requests" in stats and "requests" in old else None))
    return summary


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so a launched deployment is always stopped."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1 or not 0 <= args.stream_share <= 1 \
            or not 0 <= args.costly_clients <= 64:
        print("dynlogits.tools.load: --concurrency, --requests and --max-tokens must be >= 1, --stream-share in [0, 1], "
              "--costly-clients in [0, 64]", file=sys.stderr)
        return 2
    try:
        Mix.parse(args.mix)
    except ValueError as err:
        print(f"dynlogits.tools.load: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    launched: LaunchedDeployment | None = None
    try:
        if args.launch:
            log = Path(tempfile.gettempdir()) / f"dynlogits-load-{int(time.time())}.log"
            launched = LaunchedDeployment.start(list(args.launch_arg), log)
        summary = run(args, launched.base_url if launched else args.base_url, launched)
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as err:
        print(f"dynlogits.tools.load: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dynlogits.tools.load: interrupted", file=sys.stderr)
        return 130
    finally:
        if launched is not None:
            print("[load] stopping the deployment", file=sys.stderr, flush=True)
            launched.stop()
    print("\n".join(summary.lines()))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    return 0 if summary.clean else 1


if __name__ == "__main__":
    sys.exit(main())
