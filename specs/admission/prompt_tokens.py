"""``prompt_tokens`` for admission: opaque, it acts on tokens admission does not know (the
prompt's); a row it leaves with no token fails its request while it runs. In ``restrict`` mode its
allowed set is checked where its request is realized (``dynlogits.sdk.realization``)."""

from __future__ import annotations

from typing import Any

from .rules import OPAQUE, KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = OPAQUE
