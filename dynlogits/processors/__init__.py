"""Built-in processors, one per wire kind, and the factories that realize them from entries.

Each factory returns a FRESH processor for one request (no state shared between
requests). ``forced_text`` never reaches here (resolved to ``forced_sequence`` on
the worker); ``python`` is realized by ``dynlogits.registry``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .base import BaseLogitsProcessor, RealizeContext
from .bias import LogitBiasProcessor
from .forced import ForcedSequenceProcessor
from .min_tokens import MinTokensProcessor
from .ops import AddBias, ForceToken, KeepOnly, MaskIds, PlannedProcessor, RowOp, apply_op
from .templates import Template
from .thinking_budget import ThinkingBudgetProcessor
from .token_sets import AllowedTokensProcessor, BannedTokensProcessor

__all__ = [
    "BUILTIN_FACTORIES",
    "AddBias",
    "AllowedTokensProcessor",
    "BannedTokensProcessor",
    "BaseLogitsProcessor",
    "ForceToken",
    "ForcedSequenceProcessor",
    "KeepOnly",
    "LogitBiasProcessor",
    "MaskIds",
    "MinTokensProcessor",
    "PlannedProcessor",
    "RealizeContext",
    "RowOp",
    "Template",
    "ThinkingBudgetProcessor",
    "apply_op",
]

BUILTIN_FACTORIES: Mapping[str, Callable[[Any, RealizeContext], BaseLogitsProcessor]] = {
    "forced_sequence": lambda e, ctx: ForcedSequenceProcessor(e.token_ids, e.eos_token_id),
    "banned_tokens": lambda e, ctx: BannedTokensProcessor(e.token_ids),
    "allowed_tokens": lambda e, ctx: AllowedTokensProcessor(e.token_ids, e.eos_token_id),
    "logit_bias": lambda e, ctx: LogitBiasProcessor({int(k): v for k, v in e.bias.items()}),
    "min_tokens": lambda e, ctx: MinTokensProcessor(e.min_tokens, e.stop_token_ids),
    "thinking_budget": lambda e, ctx: ThinkingBudgetProcessor(e.start_token_ids, e.end_token_ids, e.budget),
}
