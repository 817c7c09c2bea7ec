"""``watermark`` for admission: opaque to the walks, and the payload's last acting entry.

Opaque: its step keeps exactly one of the tokens the entries before it leave (the one its
Gumbel-max draw picks from them, chosen at run time from the logits and the key), so it never
empties a row those entries leave non-empty and no walk has a position at which it could
contradict them; what it forces is not known before the request runs, so no walk models it.

Last: it draws from the row the entries before it leave (masks, forced tokens, biases), which is
what makes the draw the distribution they define; an entry that acts after it could only mask
the drawn token (the request then fails) or leave the row as it is, so one is refused at
admission naming both (``KindRules.last``). A second watermark is such an entry."""

from __future__ import annotations

from typing import Any

from .rules import KindRules

__all__ = ["RULES"]

RULES: KindRules[Any] = KindRules(
    last=True,
    last_why="it draws the sampled token from the row the entries before it leave, and forces it",
)
