"""What a worker needs of its engine: the :class:`WorkerEngine` contract, whichever engine serves.

Each engine module implements it on its own (``vllm_engine.VllmEngine``, ``sglang_engine.SglangEngine``,
siblings that share ``prompts``, not a base class); the worker's handlers (``generate``, ``app``,
``engine_life``, ``engine_stream``) see only this contract. Imports neither torch nor an engine.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol, TypeVar

from dynlogits.specs import WireEntry

from ..protocol import ChatMessage, GenerateChunk, SamplingOptions

__all__ = ["EngineRequestError", "ParamsT", "PromptTokenizer", "WorkerEngine"]

#: What an engine's :meth:`WorkerEngine.sampling_params` builds and its :meth:`WorkerEngine.generate` takes.
ParamsT = TypeVar("ParamsT")


class EngineRequestError(ValueError):
    """The engine refused one request (bad prompt, bad params): the client's fault, HTTP 400.
    ``param`` names the request field when it is known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTokenizer(Protocol):
    """The slice of a tokenizer (Hugging Face's, vLLM's ``TokenizerLike``) that renders prompts."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def apply_chat_template(self, messages: list[Any], /, **kwargs: Any) -> Any: ...


class WorkerEngine(Protocol[ParamsT]):
    """A started engine plus what the worker knows about its model.

    Guarantees every implementation gives: :meth:`render_prompt` and :meth:`sampling_params` raise only
    :class:`EngineRequestError` for a request's own fault; :meth:`generate` raises it for the engine's
    admission errors before its first chunk; nothing a request does stops the engine."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer: a :class:`PromptTokenizer` for prompts and ``policy.text.TextTokenizer``
        for entries' text (``Any``: vLLM's ``TokenizerLike`` has a read-only ``eos_token_id``, which
        ``TextTokenizer`` declares as a plain attribute)."""

    @property
    def model_name(self) -> str:
        """The name the worker serves the model under."""

    @property
    def max_model_len(self) -> int:
        """The model's context, prompt and generation together, in tokens."""

    @property
    def vocab_size(self) -> int:
        """The width of the model's logits rows (ids of prompts and entries must be below it)."""

    @property
    def adapter_registered(self) -> bool:
        """Whether the engine runs the dynlogits adapter (requests may activate entries)."""

    def render_prompt(self, *, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                      messages: Sequence[ChatMessage] | None) -> list[int]:
        """The prompt's token ids (exactly one argument is set; messages go through the chat template).

        Raises:
            EngineRequestError: the template refuses the messages, or an id is outside the vocabulary.
        """

    def sampling_params(self, options: SamplingOptions, entries: Sequence[WireEntry], extra_args: dict[str, Any], *,
                        arrival_time: float | None = None) -> ParamsT:
        """The engine's sampling params for ``options`` with ``entries`` activated (the only payload: one a
        client put in ``extra_args`` is dropped) and the request's ``arrival_time`` beside them.

        Raises:
            EngineRequestError: the engine refuses the options, naming the field where it can.
        """

    def generate(self, prompt_ids: list[int], params: ParamsT, request_id: str, *,
                 entry_paths: Sequence[str] = (), entry_kinds: Sequence[str] = ()
                 ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream the request's deltas, then one chunk with ``usage``; a request whose entries failed ends
        with a chunk carrying its failure instead, naming the entry by ``entry_paths`` (the payload's
        entries as the client knows them) and ``entry_kinds``. Closing the stream aborts the request.

        Raises:
            EngineRequestError: the engine refused the request at admission.
        """

    async def abort(self, request_id: str) -> None:
        """Abort the engine request ``request_id`` (nothing happens when it has ended)."""

    async def check_health(self) -> None:
        """Return while the engine serves; raise saying why not."""

    async def adapter_requests(self) -> int | None:
        """Requests the engine's adapter holds state for; ``None`` when the engine cannot tell (never raises)."""

    def death(self) -> str | None:
        """Why the engine died (it can never serve again), or ``None`` while it lives. A property read,
        no engine call: the worker polls it."""

    def shutdown(self) -> None:
        """Stop the engine and release what the worker opened for it."""
