"""A ``dry`` row's live history as an engine grows it, for the tests of its host paths."""

from __future__ import annotations

import random

from dynlogits.processors.dry import REBUILD_AFTER

__all__ = ["grow"]


def grow(rng: random.Random, live: list[int], alphabet: int) -> None:
    """One engine step on a live list: mostly a token (often copying an earlier stretch's next one),
    sometimes a rewrite of its newest tokens, a placeholder put in place, or a jump of many tokens."""
    roll = rng.random()
    if live and live[-1] == -1:  # the placeholder's token arrives in its place
        live[-1] = rng.randrange(alphabet)
    elif roll < 0.05 and len(live) > 3:
        live[-rng.randint(1, 3):] = [rng.randrange(alphabet) for _ in range(rng.randint(1, 3))]
    elif roll < 0.1:
        live.append(-1)
    elif roll < 0.13:
        live += [rng.randrange(alphabet) for _ in range(REBUILD_AFTER + rng.randint(1, 30))]
    elif live and roll < 0.7:
        at = rng.randrange(len(live))
        live.append(live[at + 1] if at + 1 < len(live) and live[at + 1] >= 0 else rng.randrange(alphabet))
    else:
        live.append(rng.randrange(alphabet))
