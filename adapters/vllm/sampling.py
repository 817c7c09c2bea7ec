"""What vLLM's samplers do after the adapter, and when a forced token may win by one dominating
logit instead of a masked row (``dynlogits.sdk.forcing``).

Read from vLLM 0.31.0 (the version NVIDIA Dynamo 1.6.1 pins) and 0.32.0 (installed here); both
have the same order:

* V1 runner, ``vllm/v1/sample/sampler.py`` ``Sampler.forward``: logits become float32, then
  ``apply_logits_processors``: allowed-token mask, bad words, the non-argmax-invariant processors
  (built-ins first: min_tokens, logit_bias; then custom ones: the adapter), **then** penalties
  (repetition, frequency, presence) and the engine's own ``thinking_token_budget`` forcing; then
  ``sample``: greedy argmax, or temperature, min-p, top-k/top-p and exponential sampling.
* Model Runner V2, ``vllm/v1/worker/gpu/sample/sampler.py`` ``Sampler.apply_sampling_params``:
  logits copied to float32, then logit bias (with min_tokens and allowed ids), penalties, bad
  words, custom processors (the adapter), **then** ``thinking_budget_state.apply`` (forcing that
  "runs last"), temperature, min-p, top-k/top-p and Gumbel sampling.

Everything before the adapter is seen by it (a forced id the engine masked leaves the row with no
token under either way of forcing, and fails the request alike). After it, only four things act
on a row: repetition penalty (V1; scales by the penalty or its inverse), frequency and presence
penalties (V1; shift by at most 2 per occurrence, vLLM checks both lie in [-2, 2]), the engine's
thinking budget (masks around its own forced token: it would leave the dominated ids alive where
masking leaves none, so such requests are masked), and temperature (divides; ``SamplingParams``
refuses temperatures above 2 and raises those below 0.01 to 0.01, 0.31.0 and 0.32.0 alike; 0
samples greedily). Min-p, top-k, top-p and both samplers keep or pick the
largest, which the dominating logit is, with probability exactly 1.0 in float32 as under
masking. Processed logprobs (``--logprobs-mode processed_*``) of the other ids would differ, so a
request asking for logprobs under those modes is masked too.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_TEMPERATURE", "REPETITION_PENALTY_RANGE", "dominance_is_exact"]

#: Highest temperature the rule admits: vLLM's own bound (``SamplingParams`` refuses more), far
#: inside what the dominating logit's gap allows (every other probability stays exactly 0.0 in
#: float32 up to a temperature of about 1e23).
MAX_TEMPERATURE = 2.0
#: Repetition penalties for which the dominating logit stays finite at the lowest temperature
#: vLLM divides by (0.01) and keeps its gap: ``[0.01, 100]`` (vLLM only requires it positive).
REPETITION_PENALTY_RANGE = (0.01, 100.0)


def dominance_is_exact(params: Any, *, processed_logprobs: bool = False) -> bool:
    """Whether vLLM samples exactly the same token (with the same logprob) for this request when
    its forced tokens get a dominating logit as when its row is masked; ``processed_logprobs``:
    the engine's ``--logprobs-mode`` returns processed logits or logprobs."""
    temperature = float(getattr(params, "temperature", 1.0))
    repetition = float(getattr(params, "repetition_penalty", 1.0))
    shifts = (float(getattr(params, "frequency_penalty", 0.0)), float(getattr(params, "presence_penalty", 0.0)))
    low, high = REPETITION_PENALTY_RANGE
    return (getattr(params, "thinking_token_budget", None) is None
            and math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE
            and math.isfinite(repetition) and low <= repetition <= high
            and all(math.isfinite(s) and abs(s) <= 2.0 for s in shifts)
            and not (processed_logprobs and getattr(params, "logprobs", None) is not None))
