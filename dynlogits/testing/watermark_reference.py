"""The ``watermark`` kind's reference for the conformance kit's oracle: plain Python, written from
vLLM 0.32's sources (``vllm/v1/watermarking/prfs/philox.py``, ``prfs/base.py``, ``gumbel.py``) and
the Philox paper, independently of ``dynlogits.processors.watermark_prf`` (no torch).

``watermark_token(row, key=, context_width=, history=, temperature=)`` is the token the kind forces
at the step after ``history`` (``None``: the row is left as it is): the argmax of ``row / T`` plus
the Gumbel noise of the Philox uniforms of the context (the ``context_width`` ids before the step,
``-1`` before the output) and each id. Greedy (``T`` ``None`` or below 1e-5), a context holding a
negative id (a placeholder) or one seen before in the history (vLLM's ``single_turn``
deduplication, last 8192 positions): ``None``. Float64 arithmetic on float32-rounded values: equal
to the processor's float32 draw except in near-ties (a difference below ~1e-6 between the two
largest noisy logits), which seeded checks do not meet.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

__all__ = ["philox_uniform", "watermark_token"]

_MASK = 0xFFFFFFFF


def _philox(c: list[int], k0: int, k1: int) -> list[int]:
    for r in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & _MASK, p1 & _MASK, ((p0 >> 32) ^ c[3] ^ k1) & _MASK, p0 & _MASK]
        if r < 9:
            k0, k1 = (k0 + 0x9E3779B9) & _MASK, (k1 + 0xBB67AE85) & _MASK
    return c


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def philox_uniform(key: int, context: Sequence[int], token: int) -> float:
    """vLLM's ``PhiloxPRF(key).uniform``: the float32 value (as a Python float) of ``token`` after ``context``."""
    k0, k1 = key & _MASK, key >> 32
    w = len(context)
    state = [0x574D4358, w, 0, 0]
    for off in range(0, w, 4):
        block = [(context[off + i] & _MASK) if off + i < w else _MASK - i for i in range(4)]
        state = _philox([s ^ b for s, b in zip(state, block)], (k0 ^ off) & _MASK, k1)
    t = token & _MASK
    out = _philox([t >> 2, state[0], state[1], state[2]], k0 ^ state[3], k1 ^ 0x574D544B)[t & 3]
    return _f32(((out >> 8) + 1.0) / (2**24 + 1))


def watermark_token(row: Sequence[float], *, key: int, context_width: int, history: Sequence[int],
                    temperature: float | None, top_k: int | None = None) -> int | None:
    """The token forced after ``history`` (see the module doc); ``top_k`` as vLLM applies it (ties kept)."""
    if temperature is None or temperature < 1e-5:
        return None
    n = len(history)
    context = ([-1] * context_width + list(history))[n : n + context_width]
    if any(t < 0 for t in history[max(0, n - context_width):]):
        return None
    padded = [-1] * context_width + list(history)
    for p in range(max(0, n - 8192), n):
        if padded[p : p + context_width] == context:
            return None
    x = [_f32(_f32(v) / temperature) for v in row]
    if top_k is not None and 0 < top_k < len(x):
        kth = sorted(x)[len(x) - top_k]
        x = [v if v >= kth else -math.inf for v in x]
    best, best_value = 0, -math.inf
    for i, v in enumerate(x):
        u = max(philox_uniform(key, context, i), 1.1754943508222875e-38)
        noisy = v + _f32(-math.log(-math.log(u)))
        if noisy > best_value:
            best, best_value = i, noisy
    return best
