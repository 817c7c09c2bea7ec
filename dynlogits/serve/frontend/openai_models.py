"""The OpenAI request bodies the frontend accepts, and their mapping to the worker protocol.

Unknown fields are accepted and ignored (OpenAI SDKs send more than we use); known
fields are type-checked, and a bad one is a 400 naming it. A known OpenAI or vLLM field this
deployment would *not* honour (``logprobs``, ``tools``, ``repetition_penalty``, ...) is refused
with a 400 naming it unless it holds its neutral value (:data:`UNSUPPORTED_FIELDS`): a client must
never get a 200 that silently ignored what it asked for. ``logit_bias``, ``allowed_token_ids`` and
``bad_words`` are honoured through logits-processor kinds (``dynlogits.serve.openai_controls``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dynlogits.serve.control_fields import ClientControls
from dynlogits.serve.protocol import ChatMessage, ExtraArgs, GenerateRequest, SamplingOptions, drop_smuggled_payload
from dynlogits.serve.sampling_fields import Int64, MaxTokens, Penalty, Samples, Seed, Temperature, TopK, TopP

__all__ = ["UNSUPPORTED_FIELDS", "ChatCompletionRequest", "CompletionRequest", "RequestBody", "drop_smuggled_payload",
           "unsupported_field"]

#: Fields of OpenAI's API (and vLLM's extensions of it) this frontend does not honour, each with the
#: values that ask for nothing (sent by clients that fill in defaults). Any other value is a 400.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "response_format": (None, {"type": "text"}), "tools": (None, []), "functions": (None, []),
    "tool_choice": (None, "none", "auto"), "function_call": (None, "none", "auto"), "prediction": (None,),
    "audio": (None,), "modalities": (None, ["text"]),
    # vLLM's sampling and rendering extensions
    "min_tokens": (None, 0), "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0),
    "stop_token_ids": (None, []), "include_stop_str_in_output": (None, False), "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0), "prompt_logprobs": (None, 0), "truncate_prompt_tokens": (None,),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "structured_outputs": (None,), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "guided_decoding_backend": (None,), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "add_generation_prompt": (None, True), "continue_final_message": (None, False),
    "priority": (None, 0), "return_tokens_as_token_ids": (None, False),
}
#: vLLM request fields that carry serving-stack state between processes: never from a client.
ENGINE_INTERNAL_FIELDS = ("kv_transfer_params", "ec_transfer_params")


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    # ``True == 1`` in Python: a boolean matches only a boolean (``best_of: true`` is not ``best_of: 1``).
    return any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral)


def unsupported_field(body: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, message)`` for the first field ``body`` sets that this frontend would ignore, else ``None``."""
    for name in ENGINE_INTERNAL_FIELDS:
        if body.get(name) is not None:
            return name, f"{name}: engine-internal (set only by the serving stack); a client may not send it"
    for name, neutral in UNSUPPORTED_FIELDS.items():
        if name in body and not _neutral(body[name], neutral):
            return name, (f"{name}: not supported by this deployment, so it would be ignored; remove it "
                          f"(accepted only as {' or '.join(json.dumps(n) for n in neutral)})")
    return None


class StreamOptions(BaseModel):
    include_usage: bool = False


class RequestBody(ClientControls):
    """Fields shared by chat and text completions; the control fields (OpenAI's ``{"token id": bias}``
    and vLLM's ``allowed_token_ids`` / ``bad_words``, :class:`~dynlogits.serve.control_fields.ClientControls`)
    raw as sent, mapped onto kinds and validated by ``dynlogits.serve.openai_controls`` so its errors name them."""

    model_config = ConfigDict(extra="allow")
    model: str
    #: The sampling fields, bounded as the worker bounds them (``dynlogits.serve.sampling_fields``).
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    n: Samples = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    ignore_eos: bool = False
    #: The per-request spec: a list of entries, same schema as the wire. Raw as sent until
    #: ``.validation`` replaces it with the entries it validated.
    logits_processors: Any = None
    #: Flat values only (vLLM's REST shape); ``dynamo_logits`` is dropped before the check, an
    #: engine-internal key (``kv_transfer_params``) is refused.
    vllm_xargs: ExtraArgs | None = None
    extra_args: ExtraArgs | None = None

    @field_validator("vllm_xargs", "extra_args", mode="before")
    @classmethod
    def _drop_wire_key(cls, value: Any) -> Any:
        return drop_smuggled_payload(value)

    def sampling(self) -> SamplingOptions:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingOptions(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                               top_k=self.top_k, seed=self.seed, n=self.n, stop=stop,
                               presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                               ignore_eos=self.ignore_eos)

    def client_extra_args(self) -> dict[str, Any]:
        return {**(self.extra_args or {}), **(self.vllm_xargs or {})}  # dynamo_logits already dropped

    def prompt_fields(self) -> dict[str, Any]:
        """The prompt as the worker protocol's fields (exactly one of them)."""
        raise NotImplementedError

    def generate_request(self, request_id: str) -> GenerateRequest:
        """The worker's request for this body: its entries as they are here (the frontend forwards
        them as it validated them), its logits controls as sent."""
        return GenerateRequest(request_id=request_id, sampling=self.sampling(), extra_args=self.client_extra_args(),
                               logits_processors=self.logits_processors, **self.controls(), **self.prompt_fields())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(RequestBody):
    """``POST /v1/chat/completions``; message content may be a string or text parts."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: MaxTokens | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for m in messages:
            if not isinstance(m.get("role"), str):
                raise ValueError("every message needs a string 'role'")
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise ValueError("message content must be a string or a list of text parts")
            if isinstance(content, list) and not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ValueError("only text content parts are supported")
        return messages

    def chat_messages(self) -> list[ChatMessage]:
        out = []
        for m in self.messages:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content)
            out.append(ChatMessage(role=m["role"], content=content))
        return out

    def prompt_fields(self) -> dict[str, Any]:
        return {"messages": self.chat_messages()}

    def sampling(self) -> SamplingOptions:
        options = super().sampling()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            options.max_tokens = self.max_completion_tokens
        return options


class CompletionRequest(RequestBody):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[Int64] | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[Int64] | list[str]) -> str | list[Int64] | list[str]:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("must not be empty")
            if isinstance(prompt[0], str) and len(prompt) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
        return prompt

    def prompt_fields(self) -> dict[str, Any]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], int):
            return {"prompt_token_ids": list(p)}
        return {"prompt": p[0] if isinstance(p, list) else p}
