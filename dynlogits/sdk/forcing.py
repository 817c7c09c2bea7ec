"""How a forced token wins its row: by masking every other id, or by one dominating logit.

Masking (the default, every engine) writes ``-inf`` over the whole row and ``0.0`` at the forced
id: O(vocab) writes per row, every step. A *dominating* logit writes ``DOMINATING_LOGIT`` at the
forced id alone and leaves the other ids as they were: O(1) per row.

The two pick the same token only when nothing the engine's sampler does after the adapter can
let another id win or turn the row into NaN. Which requests qualify is the adapter's decision,
made once per request from its engine's sampling parameters (``GuardedRequest.dominating``;
vLLM: ``dynlogits.adapters.vllm.sampling``). For a qualifying request the resident path (known
layout) writes the dominating logit at a forced id, and at the stop token of a row it
fail-stops for having no token left, instead of masking the row; everything else (which rows
fail, when, and what is reported) is as under masking.

What differs is visible only in processed logits: the other ids keep their finite values, so an
engine's *processed* logprobs of those ids are finite where masking makes them ``-inf`` (the
sampled token and its probability, 1.0, are the same).

Contract for an adapter that opts a request in: the logits it hands the resident path are
float32 or bfloat16 (both hold ``DOMINATING_LOGIT`` and its quotient by any temperature the
adapter admits), and after the adapter the engine only shifts or scales logits by bounded
amounts, divides by a bounded temperature, and keeps or samples the largest (top-k, top-p,
min-p, argmax, Gumbel or exponential sampling); the other ids' logits are finite and far below
``DOMINATING_LOGIT`` (below 1e20 in magnitude: a model's are tens).
"""

from __future__ import annotations

__all__ = ["DOMINATED_BELOW", "DOMINATING_LOGIT", "MASKED_WIN"]

#: The logit a forced (or fail-stop) token gets on a dominating row: 2**93 (about 9.9e27, exact in
#: float32 and bfloat16, so a row can be compared with it) leaves a gap of more than 1e25 over any
#: other id after a repetition penalty of up to 100, so ``exp`` of minus the gap over any
#: temperature vLLM accepts (at most 2) is exactly 0.0 in float32; and it stays finite divided by
#: the lowest temperature vLLM divides by (0.01) after a repetition penalty as low as 0.01 (1e32 < 3.4e38).
DOMINATING_LOGIT = 2.0**93

#: Every other id of a dominating row must stay below this (the contract's bound on the engine's
#: logits, with room for penalties and bias).
DOMINATED_BELOW = 1e20

#: The logit a forced token gets on a masked row (every other id is ``-inf``).
MASKED_WIN = 0.0
