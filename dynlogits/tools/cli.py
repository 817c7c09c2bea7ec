"""``dynlogits`` command line: validate specs and payloads, print schemas, build the default model."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dynlogits.specs import SpecError, decode_wire_payload
from dynlogits.specs.schema import payload_schema, render, spec_schema
from dynlogits.testing import SHIPPED  # torch-free: the kit's list of shipped adapters
from dynlogits.tools import watermark_cli  # torch-free: detect is imported when run

__all__ = ["main"]


def _validate(path: Path) -> int:
    """Payload (a JSON list), golden vector (``{"payload": ...}``) or config file.

    Installed plug-in kinds are accepted like built-in ones; a broken plug-in is reported
    as an error naming its entry point.
    """
    from dynlogits.policy.config import load_config

    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else None
        if isinstance(data, dict) and "payload" in data:  # a golden vector: its payload, whatever it holds
            kinds = [e.kind for e in decode_wire_payload(data["payload"])]
        elif isinstance(data, list):
            kinds = [e.kind for e in decode_wire_payload(data)]
        else:
            config = load_config(path)
            kinds = [e.kind for e in config.spec.entries] if config.spec else []
    except SpecError as err:
        for problem in err.problems:
            print(problem)
        return 1
    except (OSError, json.JSONDecodeError) as err:
        print(f"{path}: {err}")
        return 1
    print(f"ok: {len(kinds)} entr{'y' if len(kinds) == 1 else 'ies'}" + (f" ({', '.join(kinds)})" if kinds else ""))
    return 0


def _conformance(adapter: str, kind: str | None = None, entries: Sequence[str] = ()) -> int:
    from dynlogits.testing import run_conformance
    from dynlogits.testing.kind_checks import KindError

    try:
        examples = [json.loads(text) for text in entries]
    except ValueError as err:
        print(f"error: --entry is not JSON: {err}", file=sys.stderr)
        return 2
    try:
        return run_conformance(adapter, sys.stdout, kind=kind, entries=examples)
    except KindError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ImportError, ValueError, TypeError) as err:
        print(f"error: cannot load adapter {adapter!r}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynlogits", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="validate a payload, golden vector or config file; exit 1 listing each error "
                                        "(installed plug-in kinds included)")
    v.add_argument("file", type=Path)
    s = sub.add_parser("schema", help="print the JSON Schema of the dynamo_logits payload "
                                      "(built-in kinds plus installed plug-in kinds)")
    s.add_argument("--spec", action="store_true", help="print the schema of a LogitsProcessorSpec (config) instead")
    c = sub.add_parser("conformance", help="run the conformance kit against an adapter; exit 0 only when every check passes")
    c.add_argument("adapter", help=f"a shipped adapter ({', '.join(SHIPPED)}) or an import string pkg.mod:driver_factory")
    c.add_argument("--kind", metavar="NAME", default=None,
                   help="check an installed plug-in kind (entry-point group dynlogits.processors) on the adapter "
                        "instead: its rows against its own per-row processor")
    c.add_argument("--entry", metavar="JSON", action="append", default=[],
                   help="an example entry of --kind to run (repeatable; default: its spec model's json_schema_extra "
                        "examples, else {\"kind\": NAME})")
    watermark_cli.add_parser(sub)
    m = sub.add_parser("make-model", help="build the small embedded default model (no download)")
    m.add_argument("dir", type=Path)
    m.add_argument("--vocab-size", type=int, default=None, help="logits width (default: tokenizer size padded to 64)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--reasoning", action="store_true",
                   help="the reasoning variant: <think>/</think> tokens, a DeepSeek-R1-style chat template")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "validate":
        return _validate(args.file)
    if args.command == "conformance":
        if args.entry and args.kind is None:
            print("error: --entry needs --kind", file=sys.stderr)
            return 2
        return _conformance(args.adapter, args.kind, args.entry)
    if args.command == "watermark":
        return watermark_cli.run(args)
    if args.command == "schema":
        try:
            schema = spec_schema() if args.spec else payload_schema()
        except SpecError as err:  # a broken plug-in (KindError)
            print(f"error: {err}", file=sys.stderr)
            return 1
        sys.stdout.write(render(schema))
        return 0
    from dynlogits.model_builder import build_model

    try:
        out = build_model(args.dir, vocab_size=args.vocab_size, seed=args.seed, reasoning=args.reasoning)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
