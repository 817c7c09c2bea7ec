"""A request's prompt as token ids, the same way for every engine (:func:`render_prompt`).

Engines whose tokenizer follows Hugging Face's interface (vLLM's, SGLang's) render prompts here;
imports neither torch nor an engine (``jinja2`` only when a chat template runs).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol import ChatMessage
from .worker_engine import EngineRequestError, PromptTokenizer

__all__ = ["render_prompt"]


def render_prompt(tokenizer: PromptTokenizer, vocab_size: int, *, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                  messages: Sequence[ChatMessage] | None) -> list[int]:
    """Token ids of the prompt: ``messages`` through the model's chat template (with the generation
    prompt), ``prompt_token_ids`` as given, else ``prompt`` encoded with the tokenizer's special tokens.

    Args:
        tokenizer: the model's tokenizer (``encode``, ``apply_chat_template``).
        vocab_size: the logits width; every given token id must be below it.

    Raises:
        EngineRequestError: the chat template refuses the messages (``param="messages"``), or a given
            token id is outside ``[0, vocab_size)`` (``param="prompt"``).
    """
    if messages is not None:
        from jinja2 import TemplateError

        dumped = [m.model_dump() for m in messages]
        try:
            ids = tokenizer.apply_chat_template(dumped, add_generation_prompt=True, tokenize=True)
        except (TemplateError, ValueError) as err:  # the model's template refuses them (empty, role order)
            raise EngineRequestError(f"messages: the chat template refused them: {err}", "messages") from None
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    if prompt_token_ids is not None:
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise EngineRequestError(f"prompt token ids must be in [0, {vocab_size}): got {bad[:5]}", "prompt")
        return list(prompt_token_ids)
    return list(tokenizer.encode(prompt or "", add_special_tokens=True))
