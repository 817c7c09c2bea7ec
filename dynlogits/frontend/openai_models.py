"""The OpenAI request bodies the frontend accepts, and their mapping to the worker protocol.

Unknown fields are accepted and ignored (OpenAI SDKs send more than we use); known
fields are type-checked, and a bad one is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dynlogits.worker.protocol import ChatMessage, ExtraArgs, Int32, Int64, SamplingOptions, drop_smuggled_payload

__all__ = ["ChatCompletionRequest", "CompletionRequest", "RequestBody", "drop_smuggled_payload"]


class StreamOptions(BaseModel):
    include_usage: bool = False


class RequestBody(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: Int32 | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int32 | None = None
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    ignore_eos: bool = False
    #: The per-request spec: a list of entries, same schema as the wire (validated separately).
    logits_processors: Any = None
    #: Flat values only (vLLM's REST shape); ``dynamo_logits`` is dropped before the check.
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

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(RequestBody):
    """``POST /v1/chat/completions``; message content may be a string or text parts."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Int32 | None = Field(default=None, ge=1)

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
