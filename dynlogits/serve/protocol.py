"""The internal worker API shared by the frontend and the worker (pydantic only, no torch).

``POST /generate`` takes a :class:`GenerateRequest` and answers either an error
(:class:`ErrorBody`, HTTP 4xx/5xx, sent before any output) or ``200`` with
``application/x-ndjson``: one :class:`GenerateChunk` per line, the last one with
``usage`` set. An error after streaming started arrives as a chunk with ``error``; a request whose
logits-processor entries failed while it generated ends with a chunk with ``failure``
(:class:`EntryFailure`) instead of its ``finish_reason`` and ``usage``.
``GET /health`` is 200 while the process lives; ``GET /ready`` is 200 with a
:class:`WorkerInfo` once the engine serves, 503 before. Every route but ``/health`` needs the
deployment's worker secret as a bearer token when one is set (``dynlogits.serve.secret``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dynlogits.specs import WIRE_KEY

from .control_fields import ForwardedControls
from .sampling_fields import Int64, MaxTokens, Penalty, Samples, Seed, Temperature, TopK, TopP

__all__ = ["ENGINE_INTERNAL_KEYS", "ChatMessage", "EntryFailure", "ErrorBody", "ErrorDetail", "ExtraArgs", "GenerateChunk",
           "GenerateRequest", "SamplingOptions", "Usage", "WorkerInfo", "WorkerStats", "drop_smuggled_payload"]

_Scalar = StrictStr | Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | StrictFloat | StrictBool | None

#: Keys vLLM itself reads from ``SamplingParams.extra_args``: disaggregation (KV and encoder-cache
#: transfer) state, KV-cache reporting and diffusion-model stepping. Only the serving stack may set
#: them; a client's value reached the engine's internals (a ``kv_transfer_params`` that is not a
#: dict failed inside the engine: HTTP 500 and a traceback per request), so they are refused.
ENGINE_INTERNAL_KEYS = frozenset({"kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode",
                                  "diffusion_canvas_length", "diffusion_read_only", "diffusion_max_steps"})


def _client_key(key: str) -> str:
    if key in ENGINE_INTERNAL_KEYS:
        raise PydanticCustomError("engine_internal_key",
                                  "{key} is engine-internal (set only by the serving stack) and may not come from a client",
                                  {"key": key})
    return key


#: vLLM's ``vllm_xargs`` shape: flat values or flat lists (never nested objects), never an engine-internal key.
ExtraArgs = dict[Annotated[StrictStr, AfterValidator(_client_key)], _Scalar | list[_Scalar]]


def drop_smuggled_payload(extra: Any) -> Any:
    """A caller's extra args without ``dynamo_logits`` (only the gate may activate processors);
    anything but a dict is returned as is, for validation to refuse."""
    return {k: v for k, v in extra.items() if k != WIRE_KEY} if isinstance(extra, dict) else extra


class ChatMessage(BaseModel):
    """One chat turn; ``content`` already flattened to text by the frontend."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str = ""


class SamplingOptions(BaseModel):
    """The sampling knobs the worker maps onto the engine's sampling params, bounded as the frontend
    bounds them (``dynlogits.serve.sampling_fields``)."""

    model_config = ConfigDict(extra="forbid")
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    n: Samples = 1
    stop: list[str] = Field(default_factory=list)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    ignore_eos: bool = False


class GenerateRequest(ForwardedControls):
    """Exactly one of ``prompt``, ``prompt_token_ids`` and ``messages`` is set (else a 400 naming them).

    ``logits_processors`` are the client's entries as the frontend validated them (wire form); the
    worker validates them again, since its port is a trust boundary of its own. The control fields
    (:class:`~dynlogits.serve.control_fields.ForwardedControls`: ``logit_bias``, ``allowed_token_ids``,
    ``bad_words``) are the client's OpenAI/vLLM fields as sent; the worker maps them onto kinds
    (``dynlogits.serve.openai_controls``) under the same rules. ``extra_args`` is
    the client's ``vllm_xargs`` with any ``dynamo_logits`` already dropped (the worker drops it
    again); engine-internal keys are refused.
    """

    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=200)
    prompt: str | None = None
    prompt_token_ids: list[Int64] | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    sampling: SamplingOptions = Field(default_factory=SamplingOptions)
    logits_processors: list[Any] | None = None
    extra_args: ExtraArgs = Field(default_factory=dict)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _drop_wire_key(cls, value: Any) -> Any:
        return drop_smuggled_payload(value)

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        given = [name for name in ("prompt", "prompt_token_ids", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise PydanticCustomError("prompt_choice", "exactly one of prompt, prompt_token_ids and messages must be "
                                      "set; got {got}", {"got": ", ".join(given) if given else "none"})
        return self


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EntryFailure(BaseModel):
    """The request's logits-processor entries failed while it generated (``dynlogits.sdk.failure_reports``):
    ``reason`` (``no_token_left``, ``not_realized``, ``processor_error``), the failing entry's path as
    the client knows it (``logits_processors[1]``, ``deployment entries[0]``, ``logit_bias``; ``None``:
    not known), the output position it failed at (``None``: not known) and the message for the client."""

    reason: str = Field(max_length=64)
    message: str
    param: str | None = None
    position: int | None = None


class GenerateChunk(BaseModel):
    """A delta for choice ``index``; ``finish_reason`` set on its last delta, or ``failure`` on the
    request's last chunk instead (no ``usage`` follows)."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    failure: EntryFailure | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """OpenAI's error envelope; the frontend relays it unchanged."""

    error: ErrorDetail


class WorkerInfo(BaseModel):
    """What ``GET /ready`` reports about a serving worker."""

    model: str
    role: Literal["agg", "prefill", "decode", "encode"]
    backend: str
    max_model_len: int
    vocab_size: int
    deployment_kinds: list[str] = Field(default_factory=list)
    allow_request_kinds: list[str] = Field(default_factory=list)
    adapter_registered: bool = False


class WorkerStats(BaseModel):
    """``GET /stats``: requests served, those that activated processors, aborted and in flight;
    with the adapter's per-request state and the memory in use, read when asked."""

    requests: int = 0
    activated: int = 0
    aborted: int = 0
    in_flight: int = 0
    #: Sequences (``n`` per request) of the requests in flight (bounded by ``--max-inflight-sequences``).
    in_flight_sequences: int = 0
    #: ``/generate`` calls refused with 429 because they would have exceeded that bound.
    refused_capacity: int = 0
    #: Client protocol errors on this port by kind (``dynlogits.serve.http.protocol_errors.KINDS``).
    protocol_errors: dict[str, int] = Field(default_factory=dict)
    #: Requests ended by the drain deadline after SIGTERM (in-band error, engine request aborted).
    drain_aborted: int = 0
    #: Requests whose logits-processor entries failed while they generated, answered as failed, by
    #: reason (``EntryFailure.reason``).
    failures: dict[str, int] = Field(default_factory=dict)
    #: Why the engine died (``None`` while it lives); the worker then exits for its supervisor.
    engine_dead: str | None = None
    #: Requests the engine's dynlogits adapter holds state for (``None``: not readable here).
    adapter_requests: int | None = None
    #: Resident memory of the worker and its engine processes, in bytes: in all, and per process title.
    rss_bytes: int | None = None
    rss_by_process: dict[str, int] | None = None
    pid: int | None = None
