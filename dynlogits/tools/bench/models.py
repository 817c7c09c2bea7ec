"""The embedded model at the benchmark's vocabulary sizes, built once and cached.

``bench_model_dir(vocab)`` is ``$DYNLOGITS_BENCH_MODELS/vocab-<vocab>`` (default
``~/.cache/dynlogits/bench``), built with ``dynlogits.model_builder.build_model`` (atomic and
safe against concurrent builders; a complete folder is reused at once).
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["ModelSizeError", "bench_model_dir", "eos_token_id", "vllm_config"]


class ModelSizeError(ValueError):
    """The embedded model cannot be built with the vocabulary asked for (names the bound)."""


@cache
def bench_model_dir(vocab_size: int) -> Path:
    """The embedded model whose logits are ``vocab_size`` wide (built on first use, a few seconds)."""
    from dynlogits.model_builder import build_model

    root = Path(os.environ.get("DYNLOGITS_BENCH_MODELS", Path.home() / ".cache" / "dynlogits" / "bench"))
    path = root.expanduser() / f"vocab-{vocab_size}"
    if not (path / "config.json").is_file():
        print(f"[bench] building the embedded model with vocab {vocab_size} in {path} (once)", file=sys.stderr, flush=True)
    try:
        return build_model(path, vocab_size=vocab_size)
    except ValueError as exc:
        raise ModelSizeError(f"vocab {vocab_size}: {exc}") from None


def eos_token_id(model_dir: Path) -> int:
    """The model's EOS id, as vLLM reads it from ``generation_config.json``."""
    return int(json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"])


@cache
def vllm_config(vocab_size: int, max_num_seqs: int = 256) -> Any:
    """A real ``VllmConfig`` of the embedded model of that width (no engine started), scheduling up
    to ``max_num_seqs`` requests a step: vLLM's runner never holds more rows than that, and an
    adapter sizes its per-request device state by it (the CPU default is 128)."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(bench_model_dir(vocab_size)), max_model_len=2048, dtype="float32",
                        enforce_eager=True, max_num_seqs=max_num_seqs).create_engine_config()
    width = config.model_config.get_vocab_size()
    if width != vocab_size:  # pragma: no cover - a builder bug
        raise RuntimeError(f"the model built for vocab {vocab_size} has logits width {width}")
    return config
