"""``dynlogits watermark detect``: whether token ids (or a text, tokenized with a model's tokenizer)
carry the ``watermark`` kind's mark of a key; prints one JSON line
``{"score", "p_value", "num_scored_tokens", "is_watermarked"}`` (vLLM's ``GumbelWatermarkDetector``'s
statistic and p-value: ``dynlogits.processors.watermark_detect``).

The key is given as ``--key K`` (decimal) or, to keep it out of the process list and shell history,
``--key-env NAME`` (the variable holding it); it is never printed, in the result or in an error.
Importing this module imports neither torch nor an engine (``detect`` is imported when run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]

_MAX_KEY = 2**64 - 1
#: ids are at most this without a model (``specs.limits.MAX_TOKEN_ID``)
_MAX_ID = 2**31 - 1


class _Refused(Exception):
    """A bad argument: the message names it and the rule (exit 2)."""


def add_parser(sub: Any) -> None:
    """The ``watermark`` command and its ``detect`` subcommand, on the ``dynlogits`` parser's subparsers."""
    w = sub.add_parser("watermark", help="detect the watermark kind's mark (vLLM's Gumbel-max watermark) in ids or text")
    wsub = w.add_subparsers(dest="watermark_command", required=True)
    d = wsub.add_parser("detect", help="print {score, p_value, num_scored_tokens, is_watermarked} as one JSON line")
    key = d.add_mutually_exclusive_group(required=True)
    key.add_argument("--key", metavar="K", help="the watermark key, a decimal integer 0..2**64-1")
    key.add_argument("--key-env", metavar="NAME", help="the environment variable holding the key")
    d.add_argument("--context-width", metavar="W", type=int, default=4, help="the watermark's context width (default 4)")
    ids = d.add_mutually_exclusive_group(required=True)
    ids.add_argument("--token-ids", metavar="1,2,3", help="the generated ids (no prompt), comma-separated")
    ids.add_argument("--text", help="the generated text (no prompt), tokenized with --model's tokenizer")
    d.add_argument("--model", metavar="DIR", type=Path, default=None,
                   help="the model folder: its tokenizer (for --text) and its vocabulary size")
    d.add_argument("--vocab-size", metavar="N", type=int, default=None,
                   help="the logits width ids must stay below (default: the model's, else no bound but 2**31)")


def _key(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.key is not None:
        text, where = args.key, "--key"
    else:
        if args.key_env not in environ:
            raise _Refused(f"--key-env: the environment variable {args.key_env} is not set")
        text, where = environ[args.key_env], f"--key-env ({args.key_env})"
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(_MAX_KEY)) or int(text) > _MAX_KEY:
        raise _Refused(f"{where}: must be a decimal integer from 0 to {_MAX_KEY}")
    return int(text)


def _model_vocab(model: Path) -> int | None:
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise _Refused(f"--model: cannot read {model / 'config.json'}: {type(err).__name__}") from None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and size > 0 else None


def _ids(args: argparse.Namespace) -> list[int]:
    if args.token_ids is not None:
        parts = [p.strip() for p in args.token_ids.split(",") if p.strip()]
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise _Refused("--token-ids: must be non-negative decimal ids separated by commas")
        return [int(p) for p in parts]
    if args.model is None:
        raise _Refused("--text: needs --model (the tokenizer that wrote the text)")
    from transformers import AutoTokenizer  # noqa: PLC0415 - only for --text

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    return list(tokenizer.encode(args.text, add_special_tokens=False))


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    """Run ``dynlogits watermark detect``: 0 with the JSON line printed, 2 naming a bad argument."""
    from dynlogits.processors.watermark_detect import detect  # noqa: PLC0415 - torch only when run

    try:
        key = _key(args, environ)
        vocab = args.vocab_size
        if vocab is None and args.model is not None:
            vocab = _model_vocab(args.model)
        ids = _ids(args)
        result = detect(ids, key=key, context_width=args.context_width,
                        vocab_size=vocab if vocab is not None else _MAX_ID + 1)
    except (_Refused, ValueError) as err:
        message = str(err)
        if message.startswith("context_width:"):
            message = "--" + message.replace("_", "-", 1)
        elif message.startswith("token_ids"):
            message = "--" + message.replace("_", "-", 1)
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(json.dumps({"score": result.score, "p_value": result.p_value,
                      "num_scored_tokens": result.num_scored_tokens, "is_watermarked": result.is_watermarked}))
    return 0
