"""Payload and sampling-params helpers shared by the vLLM adapter tests."""

from __future__ import annotations

from typing import Any

from dynlogits.policy.text import resolve_entries
from dynlogits.specs import WIRE_KEY, ForcedTextSpec, encode_entries

PROMPT = "Please write a short story about a cat who wanted to fly."

FORCED_TEXTS = [
    "Hello world!",
    "Yes.",
    "No, thank you.",
    "The answer is forty-two.",
    "My name is Ada.",
    "Red, green, blue.",
    '{"role": "assistant", "content": "hello"}',
    "def main(argv): return 0",
    "The train will arrive at nine o'clock.",
    "Good morning, good afternoon, good evening and good night!",
    "Numbers: 0 1 2 3 4 5 6 7 8 9",
    "Once upon a time there was a cat.",
]


def forced_payload(tokenizer: Any, text: str) -> list[dict[str, Any]]:
    """The wire payload forcing ``text`` (resolved with the worker's tokenizer)."""
    return encode_entries(resolve_entries([ForcedTextSpec(text=text)], tokenizer))


def params(payload: Any = None, *, max_tokens: int = 64, **kwargs: Any) -> Any:
    """Greedy ``SamplingParams`` carrying ``payload`` (``None``: no ``dynamo_logits`` at all)."""
    from vllm import SamplingParams

    extra = None if payload is None else {WIRE_KEY: payload}
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra, **kwargs)

