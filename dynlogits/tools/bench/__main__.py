"""``python -m dynlogits.tools.bench {micro,engine,wire,all,admission}``: run the suites, print tables and targets.

Prints the machine and versions, one table per suite with the ratios the targets are checked on,
and one line per target (met / NOT MET / undecided / not measured). ``--json FILE`` writes every measurement
as a record (``dynlogits.tools.bench.records``); ``--write-docs`` regenerates ``docs/performance.md``
and its plot. ``--quick`` is a smoke run (under a minute for ``micro``, ``wire`` and ``all``; ``all
--quick`` leaves the engine suite out, ``engine --quick`` runs it on a tiny configuration).
``admission`` (its own flags: ``admission --help``) times the consistency checks on the worst payloads
within the default limits against the admission work budget (``dynlogits.tools.bench.admission``).
Exit status: 0 when the run completed, whatever the targets say; 1 when an implementation
produced wrong results or an engine failed; 2 for bad arguments (e.g. ``--device cuda`` without CUDA).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

__all__ = ["main"]

T = TypeVar("T")

_SUITES = ("micro", "engine", "wire", "all", "admission")
_DOCS_DIR = Path(__file__).resolve().parents[3] / "docs"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _kinds(text: str) -> tuple[str, ...]:
    from .workloads import KINDS

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"unknown kind(s) {bad or text!r}; choose from {', '.join(KINDS)}")
    return kinds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynlogits.tools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=_SUITES, help="which suite to run")
    p.add_argument("--quick", action="store_true", help="a smoke run: few sizes and repetitions (see above)")
    p.add_argument("--json", metavar="FILE", type=Path, help="write every measurement as a JSON list of records")
    p.add_argument("--device", default="cpu", help="micro suite device: cpu (default) or cuda[:N] (must exist)")
    p.add_argument("--threads", type=_positive, default=1, help="torch.set_num_threads for the micro suite (default 1)")
    p.add_argument("--write-docs", action="store_true", help="regenerate performance.md and its plot")
    p.add_argument("--docs-dir", type=Path, default=_DOCS_DIR, help=f"where --write-docs writes (default {_DOCS_DIR})")
    m = p.add_argument_group("micro")
    m.add_argument("--batches", type=_ints, help="batch sizes (default 1,8,64,256; quick 1,64)")
    m.add_argument("--vocabs", type=_ints, help="logits widths (default 32000,151936; quick 151936)")
    m.add_argument("--kinds", type=_kinds, help="workloads (default all)")
    m.add_argument("--repeats", type=_positive, help="timed repetitions per measurement (default 30; quick 5)")
    m.add_argument("--max-model-len", type=_positive,
                   help="the runner's max_model_len, the width of Model Runner V2's token matrix (default: the "
                        "history's length at the last step); a longer one shows what reading the matrix costs")
    e = p.add_argument_group("engine")
    e.add_argument("--engine-requests", type=_positive, help="concurrent requests (default 64; quick 4)")
    e.add_argument("--engine-tokens", type=_positive, help="tokens per request (default 64; quick 8)")
    e.add_argument("--engine-rounds", type=_positive,
                   help="timed rounds after a warm-up round, one batch per kind each, medians kept (default 25; quick 2)")
    e.add_argument("--engine-vocab", type=_positive, help="model vocabulary (default 151936; quick 1024)")
    return p


def _pick(value: T | None, default: T, quick_value: T, quick: bool) -> T:
    """An explicit flag wins; else the quick or the full default."""
    return value if value is not None else (quick_value if quick else default)


def main(argv: Sequence[str] | None = None) -> int:
    if (list(sys.argv[1:] if argv is None else argv))[:1] == ["admission"]:  # torch-free, its own flags
        from .admission import main as admission

        return admission(list(sys.argv[2:] if argv is None else argv[1:]))
    args = _parser().parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's config log lines would bury the tables
    command = "python -m dynlogits.tools.bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device}: CUDA is not available here (torch {torch.__version__}, "
              f"torch.cuda.is_available() is False); run without --device or on a machine with a GPU", file=sys.stderr)
        return 2
    if args.device != "cpu" and not args.device.startswith("cuda"):
        print(f"error: --device {args.device}: expected cpu or cuda[:N]", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)

    from .engine import EngineError, EngineOptions, run_engine
    from .machine import describe_machine
    from .micro import BenchmarkError, MicroOptions, run_micro
    from .models import ModelSizeError
    from .records import Record, write_json
    from .report import TARGET_VOCAB, engine_table, forcing_bound_lines, micro_tables, target_lines, wire_table
    from .wire import WireOptions, run_wire

    machine = describe_machine(threads=args.threads, device=args.device)
    print("\n".join(machine.lines()), flush=True)
    records: list[Record] = []
    notes: list[str] = []
    settings: dict[str, str] = {}
    run = {args.suite} if args.suite != "all" else {"micro", "engine", "wire"}
    if args.suite == "all" and args.quick:
        run.discard("engine")
        notes.append("engine: left out of `all --quick` (each engine takes about a minute to start); "
                     "`engine --quick` runs it on a tiny configuration")
    q = args.quick
    try:
        if "micro" in run:
            try:
                opts = MicroOptions(
                    kinds=args.kinds or MicroOptions.kinds,
                    batches=_pick(args.batches, MicroOptions.batches, (1, 64), q),
                    vocabs=_pick(args.vocabs, MicroOptions.vocabs, (151936,), q),
                    repeats=_pick(args.repeats, MicroOptions.repeats, 5, q),
                    warmup=1 if q else MicroOptions.warmup,
                    device=args.device,
                    max_model_len=args.max_model_len,
                )
            except ValueError as exc:  # an option the others make impossible (--max-model-len)
                print(f"error: {exc}", file=sys.stderr)
                return 2
            micro, skipped = run_micro(opts)
            records += micro
            notes += skipped
            width = ("" if opts.max_model_len is None
                     else f"; max_model_len {opts.max_model_len} (Model Runner V2's token matrix width)")
            settings["micro"] = (f"prompt {opts.prompt_len} tokens; {opts.warmup} warm-up + {opts.repeats} timed steps "
                                 f"per measurement, medians{width}")
            print(f"\n## micro ({settings['micro']})\n")
            print("\n".join(micro_tables(micro)), flush=True)
        if "engine" in run:
            eopts = EngineOptions(
                requests=_pick(args.engine_requests, EngineOptions.requests, 4, q),
                tokens=_pick(args.engine_tokens, EngineOptions.tokens, 8, q),
                rounds=_pick(args.engine_rounds, EngineOptions.rounds, 2, q),
                vocab=_pick(args.engine_vocab, EngineOptions.vocab, 1024, q),
            )
            engine, skipped = run_engine(eopts)
            records += engine
            notes += skipped
            settings["engine"] = (f"vLLM engine on the embedded model with vocab {eopts.vocab}; batches of "
                                  f"{eopts.requests} concurrent requests x {eopts.tokens} tokens; per engine a warm-up "
                                  f"round, then {eopts.rounds} rounds of one batch per kind, kinds in an order that "
                                  "changes every round; medians over the rounds")
            print(f"\n## engine ({settings['engine']})\n")
            print("\n".join(engine_table(engine)), flush=True)
        if "wire" in run:
            wopts = WireOptions(rounds=5, calls_per_round=100) if q else WireOptions()
            wire = run_wire(wopts)
            records += wire
            settings["wire"] = (f"one payload, µs per call: median over {wopts.rounds} rounds of "
                                f"{wopts.calls_per_round} calls")
            print(f"\n## wire ({settings['wire']})\n")
            print("\n".join(wire_table(wire)), flush=True)
    except ModelSizeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BenchmarkError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    same_rows = "engine" in run and eopts.vocab == TARGET_VOCAB  # the micro floor's rows are the engine's
    bounds = forcing_bound_lines(records, engine_requests=eopts.requests if same_rows else None)
    print("\n## targets\n")
    print("\n".join([*target_lines(records), *bounds]))
    for note in notes:
        print(f"skipped: {note}")
    if args.json is not None:
        write_json(args.json, records)
        print(f"\nwrote {len(records)} records to {args.json}")
    if args.write_docs:
        from .docs import write_docs

        path = write_docs(records, machine, args.docs_dir, command=command, settings=settings, notes=notes,
                          bounds=bounds)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
