"""Each sampling field's type and bounds, declared once.

The frontend's OpenAI body (``frontend.openai_models.RequestBody``) and the worker's
``protocol.SamplingOptions`` declare their sampling fields with these types, so the two accept and
refuse the same values; a refusal names the field and the rule (pydantic's message under the
field's path, e.g. ``temperature: Input should be less than or equal to 2``). The bounds are
OpenAI's where it states them (``temperature`` in [0, 2], the penalties in [-2, 2], ``top_p`` in
(0, 1]); the engine checks what is left (``top_k`` below -1, say) and its refusal names the field
too. Pydantic only.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

__all__ = ["MAX_SAMPLES", "Int32", "Int64", "MaxTokens", "Penalty", "Samples", "Seed", "Temperature", "TopK", "TopP"]

#: Integers reach the engine as fixed-width values (msgpack, torch generators): a larger one must
#: fail its own request here, not raise inside the engine.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]

#: The most sequences (``n``) one request may ask for.
MAX_SAMPLES = 16

#: Tokens to generate (``max_tokens``, chat's ``max_completion_tokens``): at least 1.
MaxTokens = Annotated[int, Field(ge=1, le=2**31 - 1)]
#: Sampling temperature: 0 (greedy) to 2.
Temperature = Annotated[float, Field(ge=0, le=2)]
#: Nucleus sampling's probability mass: more than 0, at most 1.
TopP = Annotated[float, Field(gt=0, le=1)]
#: Top-k sampling: a 32-bit integer (the engine refuses values it has no meaning for).
TopK = Int32
#: The request's sampling seed: a 64-bit integer.
Seed = Int64
#: Sequences to generate (``n``): 1 to :data:`MAX_SAMPLES`.
Samples = Annotated[int, Field(ge=1, le=MAX_SAMPLES)]
#: ``presence_penalty`` and ``frequency_penalty``: -2 to 2.
Penalty = Annotated[float, Field(ge=-2, le=2)]
