"""``no_repeat_ngram`` for admission: opaque. What it masks depends on the tokens the request
generates (and, with ``include_prompt``, on its prompt), which admission does not know: any output
a walk follows could repeat an n-gram or not depending on the tokens sampled before it. It only
ever masks tokens that would repeat an n-gram, so a forced sequence or a choice that repeats one
leaves its row with no token and fails its request while it runs (docs/specs.md)."""

from __future__ import annotations

from typing import Any

from .rules import OPAQUE, KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = OPAQUE
