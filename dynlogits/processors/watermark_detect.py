"""Detecting the ``watermark`` kind's Gumbel-max watermark in token ids: the same statistic and
p-value as vLLM 0.32's ``GumbelWatermarkDetector(key, context_width, prf="philox")``.

Each token is scored with the PRF value ``u`` of its context (the ``context_width`` ids before it,
``-1`` before the first) and its id: ``-log(1 - u)``, which is Exp(1) for text written without the
key and larger for watermarked text (the Gumbel-max draw favours ids whose ``u`` is high). As in
vLLM (``deduplicate_contexts=True``), only a context's first occurrence is scored: a repeated
context reuses its random values, so its token is no new evidence (and the generator leaves such
steps to the engine's own sampler). The score is the sum over the ``k`` scored tokens; under "no
watermark" it is Gamma(k, 1), so the p-value is its survival function,
``exp(-s) * sum_{i<k} s^i / i!``, computed in log space as vLLM computes it. The vocabulary size
plays no part in the statistic (the PRF value of an id does not depend on it); it only bounds the
ids accepted. Torch on the CPU; no engine import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dynlogits.specs.builtin.watermark import MAX_CONTEXT_WIDTH, MAX_DETECT_TOKENS

from .watermark_prf import MAX_KEY, uniform

__all__ = ["P_VALUE_THRESHOLD", "WatermarkDetection", "detect", "gamma_survival"]

#: ``is_watermarked`` below this p-value (vLLM's detector's default threshold).
P_VALUE_THRESHOLD = 0.01


@dataclass(frozen=True)
class WatermarkDetection:
    """One detection: ``score`` (the sum of the scored tokens' ``-log(1 - u)``), ``p_value`` (the
    chance of a score this high without the watermark), ``num_scored_tokens`` (tokens with a
    context not seen before in the ids) and ``is_watermarked`` (``p_value <= 0.01``)."""

    score: float
    p_value: float
    num_scored_tokens: int
    is_watermarked: bool


def gamma_survival(score: float, shape: int) -> float:
    """``P(Gamma(shape, 1) > score)`` for an integer shape: 1 when either is not positive; the
    same sum in the same order as vLLM's ``_gamma_survival_integer_shape``."""
    if shape <= 0 or score <= 0:
        return 1.0
    log_score = math.log(score)
    term = 0.0
    top = 0.0
    terms = [term]
    for index in range(1, shape):
        term += log_score - math.log(index)
        terms.append(term)
        top = max(top, term)
    log_sum = top + math.log(sum(math.exp(t - top) for t in terms))
    return min(1.0, math.exp(min(0.0, -score + log_sum)))


def _scored(token_ids: Sequence[int], width: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each token's context and the token, first occurrences of a context only."""
    contexts: list[tuple[int, ...]] = []
    targets: list[int] = []
    seen: set[tuple[int, ...]] = set()
    window = [-1] * width
    for token in token_ids:
        context = tuple(window[-width:])
        if context not in seen:
            seen.add(context)
            contexts.append(context)
            targets.append(token)
        window.append(token)
    return contexts, targets


def detect(token_ids: Sequence[int], *, key: int, context_width: int, vocab_size: int) -> WatermarkDetection:
    """Whether ``token_ids`` (a generated output, without its prompt) carry the watermark of ``key``
    with ``context_width``. Raises ``ValueError`` naming the argument and the rule for a key
    outside ``[0, 2**64 - 1]``, a width outside ``[1, MAX_CONTEXT_WIDTH]``, more than
    ``MAX_DETECT_TOKENS`` ids, or an id outside ``[0, vocab_size)`` (all checked before any work)."""
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= MAX_KEY:
        raise ValueError("key: must be an integer in [0, 2**64 - 1]")
    if isinstance(context_width, bool) or not isinstance(context_width, int) or not 1 <= context_width <= MAX_CONTEXT_WIDTH:
        raise ValueError(f"context_width: must be an integer in [1, {MAX_CONTEXT_WIDTH}]")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError("vocab_size: must be a positive integer")
    if len(token_ids) > MAX_DETECT_TOKENS:
        raise ValueError(f"token_ids: is {len(token_ids)} ids; must be at most {MAX_DETECT_TOKENS}")
    for i, token in enumerate(token_ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"token_ids[{i}]: must be an integer in [0, {vocab_size})")
    contexts, targets = _scored(token_ids, context_width)
    if not targets:
        return WatermarkDetection(0.0, 1.0, 0, False)
    u = uniform(key, torch.tensor(contexts, dtype=torch.int64).reshape(-1, context_width),
                torch.tensor(targets, dtype=torch.int64).unsqueeze(-1)).squeeze(-1)
    score = float((-torch.log1p(-u.to(torch.float64))).sum().item())
    p_value = gamma_survival(score, len(targets))
    return WatermarkDetection(score=score, p_value=p_value, num_scored_tokens=len(targets),
                              is_watermarked=p_value <= P_VALUE_THRESHOLD)
