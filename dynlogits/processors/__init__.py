"""Built-in processors, one per wire kind, and what realization builds from them.

Modules: one per built-in kind (``forced``, ``token_sets``, ``bias``, ``min_tokens``,
``thinking_budget``), ``base`` (the processor contract), ``ops`` (row operations the batched
paths apply), ``templates`` (what the resident path compiles), ``request`` (all processors of
one request) and ``registry`` (kind -> factory: built-ins, plug-in kinds, ``python``).
``forced_text`` never reaches here (resolved to ``forced_sequence`` on the worker).
"""

from __future__ import annotations

from .base import BaseLogitsProcessor, RealizeContext
from .bias import LogitBiasProcessor
from .forced import ForcedSequenceProcessor
from .min_tokens import MinTokensProcessor
from .ops import AddBias, ForceToken, KeepOnly, MaskIds, PlannedProcessor, RowOp, apply_op
from .templates import Template
from .thinking_budget import ThinkingBudgetProcessor
from .token_sets import AllowedTokensProcessor, BannedTokensProcessor

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
