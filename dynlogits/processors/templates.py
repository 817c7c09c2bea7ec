"""What a built-in processor does at *every* step, as data: the form the resident apply path runs.

A ``RowOp`` (``ops``) says what a processor does at one step, given the history. A *template* says
it for all steps at once, so an engine with persistent request slots can keep the data on the
device (``dynlogits.sdk.resident.slot_batch``) and derive each step's operation there from the step's
position, without the host planning anything per step:

=====================  ===================================  ===========================================
template               built-in kind                        a step at generated count ``n``
=====================  ===================================  ===========================================
``MaskTemplate``       ``banned_tokens``                    ``row[ids] = -inf``
``BiasTemplate``       ``logit_bias``                       ``row[ids] += values``
``KeepTemplate``       ``allowed_tokens``                   every id outside ``ids`` becomes ``-inf``
``ForceSeqTemplate``   ``forced_sequence``                  force ``tokens[n]`` (``eos`` once ``n >= len``)
``MaskBeforeTemplate`` ``min_tokens``                       ``row[ids] = -inf`` while ``n < min_tokens``
``ThinkingTemplate``   ``thinking_budget``                  force the next end token once the budget is spent
=====================  ===================================  ===========================================

"Force" never unmasks (``ops.ForceToken``). Templates hold plain tuples: no torch, no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = [
    "BiasTemplate",
    "ForceSeqTemplate",
    "KeepTemplate",
    "MaskBeforeTemplate",
    "MaskTemplate",
    "Template",
    "ThinkingTemplate",
]


@dataclass(frozen=True, slots=True)
class MaskTemplate:
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BiasTemplate:
    ids: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class KeepTemplate:
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ForceSeqTemplate:
    tokens: tuple[int, ...]
    eos: int


@dataclass(frozen=True, slots=True)
class MaskBeforeTemplate:
    ids: tuple[int, ...]
    min_tokens: int


@dataclass(frozen=True, slots=True)
class ThinkingTemplate:
    start: tuple[int, ...]
    end: tuple[int, ...]
    budget: int


Template = Union[MaskTemplate, BiasTemplate, KeepTemplate, ForceSeqTemplate, MaskBeforeTemplate, ThinkingTemplate]
