"""The built-in kinds, one module per kind, each declaring its ``KIND`` (a ``ProcessorKind``).

``MODULES`` is the one ordered list of them. Its order is the union order of ``Entry`` (and of
``WireEntry``, the fast decode table and the JSON Schema), which sets the order of "expected one
of" in errors: a new built-in kind is one module here and its line in ``MODULES``. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from ..kinds import ProcessorKind
from . import (
    allowed_tokens,
    banned_phrases,
    banned_tokens,
    deadline,
    dry,
    forced_sequence,
    forced_text,
    logit_bias,
    min_tokens,
    multiple_choice,
    no_repeat_ngram,
    prompt_tokens,
    python,
    reasoning,
    thinking_budget,
    trigger,
    watermark,
)
from .allowed_tokens import AllowedTokens, AllowedTokensSpec
from .banned_phrases import BannedPhrases, BannedPhrasesSpec
from .banned_tokens import BannedTokens, BannedTokensSpec
from .deadline import Deadline, DeadlineSpec
from .dry import Dry, DrySpec
from .forced_sequence import ForcedSequence, ForcedTokenSequenceSpec
from .forced_text import ForcedTextSpec
from .logit_bias import LogitBias, LogitBiasSpec
from .min_tokens import MinTokens, MinTokensSpec
from .multiple_choice import MultipleChoice, MultipleChoiceSpec
from .no_repeat_ngram import NoRepeatNgram, NoRepeatNgramSpec
from .prompt_tokens import PromptTokens, PromptTokensSpec
from .python import Python, PythonProcessorSpec
from .reasoning import Reasoning, ReasoningSpec
from .thinking_budget import ThinkingBudget, ThinkingBudgetSpec
from .trigger import Trigger, TriggerSpec
from .watermark import Watermark, WatermarkSpec

# The models and twins by name, for ``specs.entries`` and ``specs.fast`` to re-export (their old homes).
__all__ = ["BUILTIN", "BUILTIN_NAMES", "DECLARED", "MODULES", "AllowedTokens", "AllowedTokensSpec", "BannedPhrases",
           "BannedPhrasesSpec", "BannedTokens", "BannedTokensSpec", "Deadline", "DeadlineSpec", "Dry", "DrySpec", "ForcedSequence",
           "ForcedTextSpec", "ForcedTokenSequenceSpec", "LogitBias", "LogitBiasSpec", "MinTokens", "MinTokensSpec",
           "MultipleChoice", "MultipleChoiceSpec", "NoRepeatNgram",
           "NoRepeatNgramSpec", "PromptTokens", "PromptTokensSpec", "Python", "PythonProcessorSpec",
           "Reasoning", "ReasoningSpec", "ThinkingBudget", "ThinkingBudgetSpec", "Trigger", "TriggerSpec", "Watermark",
           "WatermarkSpec"]

#: The built-in kinds' modules, in union order.
MODULES: tuple[ModuleType, ...] = (
    forced_sequence,
    forced_text,
    banned_tokens,
    allowed_tokens,
    logit_bias,
    min_tokens,
    thinking_budget,
    reasoning,
    banned_phrases,
    multiple_choice,
    trigger,
    deadline,
    prompt_tokens,
    no_repeat_ngram,
    dry,
    watermark,
    python,
)

#: Their declarations, in union order.
DECLARED: tuple[ProcessorKind, ...] = tuple(module.KIND for module in MODULES)
#: Kind name -> declaration.
BUILTIN: Mapping[str, ProcessorKind] = MappingProxyType({k.kind: k for k in DECLARED})
BUILTIN_NAMES: frozenset[str] = frozenset(BUILTIN)
