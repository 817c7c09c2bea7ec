"""Built-in processors, one module per wire kind, and what realization builds from them.

A kind's module (``forced_sequence``, ``banned_tokens``, ``allowed_tokens``, ``logit_bias``,
``min_tokens``, ``thinking_budget``) holds its processor (the per-row step, a ``RowOp`` where it can
be one), its template (every step as data) and its resident group (slot tables and tensor ops).
Shared: ``base`` (the processor contract), ``ops`` (row operations), ``slots`` (the resident groups'
base and layouts), ``uploads`` (host values to the device without blocking), ``request`` (one
request's processors), ``registry`` (kind -> factory), ``kept`` (bounded memos). ``forced_text`` is resolved on the worker."""

from __future__ import annotations

from .allowed_tokens import AllowedTokensProcessor
from .banned_tokens import BannedTokensProcessor
from .base import BaseLogitsProcessor, RealizeContext
from .forced_sequence import ForcedSequenceProcessor
from .logit_bias import LogitBiasProcessor
from .min_tokens import MinTokensProcessor
from .ops import AddBias, ForceToken, KeepOnly, MaskIds, PlannedProcessor, RowOp, apply_op
from .slots import Template
from .thinking_budget import ThinkingBudgetProcessor

__all__ = [
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
