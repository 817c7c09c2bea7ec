"""Built-in processors, one module per kind that builds one, and what realization builds from them.

A kind's module (``dynlogits.processors.<kind>``, named by its declaration's factory in
``dynlogits.specs.builtin``) holds its processor (the per-row step, a ``RowOp`` where it can be
one), its template (every step as data) and its resident group (slot tables and tensor ops); the
modules in force are ``registry.BUILTIN_KINDS``. Shared: ``base`` (the processor contract),
``ops`` (row operations), ``slots`` (the resident groups' base and layouts), ``uploads`` (host
values to the device without blocking), ``request`` (one request's processors), ``registry``
(kind -> factory), ``kept`` (bounded memos). Kinds that do not cross the wire are resolved on the
worker."""

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
