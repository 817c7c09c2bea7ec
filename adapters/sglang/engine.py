"""SGLang engine settings the adapter needs, set by one helper and checked up front.

* ``--enable-custom-logit-processor`` (``ServerArgs.enable_custom_logit_processor``, off by default;
  SGLang refuses it with ``--enable-watermark``: ``arg_groups/validation_hook.py``).
* ``SGLANG_ENABLE_DELAY_SAMPLE=1``: the sampler runs after the previous batch's tokens are appended
  (``Scheduler.launch_batch_sample_if_needed``), so histories are complete.
* Speculative decoding is refused (any ``speculative_algorithm`` but ``None``/``"NONE"``): in 0.5.21
  and 0.5.23 ``speculative/eagle_utils.py`` ``eagle_sample`` skips custom processors, DFlash/DSpark
  apply them without draft tokens (``speculative/dflash_utils.py``), UNO raises
  (``speculative/uno_worker_v2.py``). The processor repeats this check in the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DELAY_SAMPLE_ENV", "UnsupportedEngineConfig", "check_server_args", "enable_adapter", "sglang_engine_env",
           "speculative_refusal"]

DELAY_SAMPLE_ENV = "SGLANG_ENABLE_DELAY_SAMPLE"


class UnsupportedEngineConfig(ValueError):
    """The SGLang configuration cannot run dynamo logits processors; the message says why."""


def _get(args: Any, name: str) -> Any:
    return args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)


def sglang_engine_env() -> dict[str, str]:
    """Environment the SGLang engine processes need (set before the engine starts)."""
    return {DELAY_SAMPLE_ENV: "1"}


def check_server_args(server_args: Any) -> None:
    """Raise ``UnsupportedEngineConfig`` for settings under which processors cannot run correctly
    (``server_args``: SGLang's ``ServerArgs`` or a mapping of its fields)."""
    if _get(server_args, "enable_watermark"):
        raise UnsupportedEngineConfig(
            "dynamo logits processors need --enable-custom-logit-processor, which SGLang refuses together with "
            "--enable-watermark")
    refusal = speculative_refusal(_get(server_args, "speculative_algorithm"))
    if refusal is not None:
        raise UnsupportedEngineConfig(refusal)


def speculative_refusal(algorithm: Any) -> str | None:
    """Why processors cannot run under ``speculative_algorithm`` (``None`` when decoding is not
    speculative); the message ``check_server_args`` raises and the processor reports."""
    if algorithm is None or str(algorithm).upper() in ("", "NONE"):
        return None
    return (
        f"dynamo logits processors cannot run with speculative decoding on SGLang (speculative_algorithm={algorithm!r}): "
        "EAGLE, EAGLE3, STANDALONE, FROZEN_KV_MTP and NGRAM never call custom logit processors after the first token "
        "(SGLang 0.5.21, 0.5.23: they would be skipped silently), DFLASH and DSPARK apply them to verify rows without "
        "the draft tokens, UNO does not support them; run without --speculative-algorithm")


def enable_adapter(server_args: Any) -> Any:
    """Turn on ``enable_custom_logit_processor`` on ``server_args`` (``ServerArgs`` or a kwargs dict)
    after ``check_server_args``; returns it."""
    check_server_args(server_args)
    if isinstance(server_args, dict):
        server_args["enable_custom_logit_processor"] = True
    else:
        server_args.enable_custom_logit_processor = True
    return server_args
