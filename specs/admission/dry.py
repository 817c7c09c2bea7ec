"""``dry`` for admission: opaque. It only ever subtracts a finite penalty from some logits (at most
the row dtype's largest finite value, so a finite logit stays finite): it masks no token, forces
none and restricts no set, so it cannot leave a row without a token that the other entries left
one, and no consistency walk has anything to meet. (Which tokens it penalizes depends on the
history, the prompt and the tokenizer's vocabulary, none of which admission knows.)"""

from __future__ import annotations

from typing import Any

from .rules import OPAQUE, KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = OPAQUE
