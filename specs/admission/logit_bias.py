"""``logit_bias`` for admission: it shifts logits and never empties a row, so it leaves the allowed
set as it is (it still counts as an entry acting on the row)."""

from __future__ import annotations

from typing import Any

from .rules import KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = KindRules()
