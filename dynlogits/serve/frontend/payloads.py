"""OpenAI response objects for one request: streamed chunks (:meth:`Payloads.delta`,
:meth:`Payloads.usage_chunk`) and the aggregated answer (:meth:`Payloads.final`)."""

from __future__ import annotations

import time
from typing import Any, Literal

from dynlogits.serve.protocol import GenerateChunk, Usage

__all__ = ["ChatPayloads", "CompletionPayloads", "Endpoint", "Payloads", "payloads_for"]

Endpoint = Literal["chat", "completion"]
_FINISH = {"stop": "stop", "length": "length"}


def _finish_reason(reason: str | None) -> str:
    return _FINISH.get(reason or "", "stop")


class Payloads:
    """Builds OpenAI response objects for one request."""

    object_final = ""
    object_chunk = ""

    def __init__(self, rid: str, model: str) -> None:
        self.rid, self.model, self.created = rid, model, int(time.time())
        self._started: set[int] = set()

    def _envelope(self, obj: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, **fields}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self._envelope(self.object_chunk, choices=[], usage=usage.model_dump())

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        raise NotImplementedError

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        raise NotImplementedError


class ChatPayloads(Payloads):
    object_final, object_chunk = "chat.completion", "chat.completion.chunk"

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if chunk.index not in self._started:
            self._started.add(chunk.index)
            delta["role"] = "assistant"
        delta["content"] = chunk.text
        choice = {"index": chunk.index, "delta": delta, "logprobs": None,
                  "finish_reason": _finish_reason(chunk.finish_reason) if chunk.finish_reason else None}
        return self._envelope(self.object_chunk, choices=[choice])

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None,
                    "finish_reason": _finish_reason(finish.get(i))} for i, t in texts.items()]
        return self._envelope(self.object_final, choices=choices, usage=usage.model_dump() if usage else None)


class CompletionPayloads(Payloads):
    object_final = object_chunk = "text_completion"

    def delta(self, chunk: GenerateChunk) -> dict[str, Any]:
        choice = {"index": chunk.index, "text": chunk.text, "logprobs": None,
                  "finish_reason": _finish_reason(chunk.finish_reason) if chunk.finish_reason else None}
        return self._envelope(self.object_chunk, choices=[choice])

    def final(self, texts: dict[int, str], finish: dict[int, str | None], usage: Usage | None) -> dict[str, Any]:
        choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": _finish_reason(finish.get(i))}
                   for i, t in texts.items()]
        return self._envelope(self.object_final, choices=choices, usage=usage.model_dump() if usage else None)


def payloads_for(endpoint: Endpoint, rid: str, model: str) -> Payloads:
    return ChatPayloads(rid, model) if endpoint == "chat" else CompletionPayloads(rid, model)
