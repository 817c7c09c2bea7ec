"""``python`` for admission: opaque, it runs code admission cannot read; a row it leaves with no
token fails its request while it runs."""

from __future__ import annotations

from typing import Any

from .rules import OPAQUE, KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = OPAQUE
