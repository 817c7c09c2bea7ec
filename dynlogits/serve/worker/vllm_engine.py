"""The vLLM engine behind a worker: construction, prompt rendering, streaming generation.

Imports vLLM lazily (inside :func:`start_vllm_engine`) so the rest of the worker
package stays importable without an engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from dynlogits.sdk.activation import activate_logits_processors
from dynlogits.specs import WIRE_KEY

from .introspect import EXTENSION_CLASS
from ..protocol import ChatMessage, GenerateChunk, SamplingOptions, Usage

__all__ = ["ADAPTER_CLASS", "EngineRequestError", "VllmEngine", "start_vllm_engine"]

log = logging.getLogger("dynlogits.serve.worker")

ADAPTER_CLASS = "dynlogits.adapters.vllm:DynamoVllmLogitsProcessor"


class EngineRequestError(ValueError):
    """The engine refused one request (bad prompt, bad params): the client's fault, HTTP 400.
    ``param`` names the request field when it is known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class VllmEngine:
    """A started ``AsyncLLM`` plus what the worker needs to know about its model."""

    engine: Any
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    adapter_registered: bool
    #: Whether ``AdapterIntrospection`` is mixed into the engine's workers (``GET /stats`` asks
    #: them for the adapter's state only then: elsewhere the call raises inside the engine).
    introspection: bool = False

    def render_prompt(self, *, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                      messages: Sequence[ChatMessage] | None) -> list[int]:
        """Token ids of the prompt; chat messages go through the model's chat template."""
        if messages is not None:
            from jinja2 import TemplateError

            dumped = [m.model_dump() for m in messages]
            try:
                ids = self.tokenizer.apply_chat_template(dumped, add_generation_prompt=True, tokenize=True)
            except (TemplateError, ValueError) as err:  # the model's template refuses them (empty, role order)
                raise EngineRequestError(f"messages: the chat template refused them: {err}", "messages") from None
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        if prompt_token_ids is not None:
            bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise EngineRequestError(f"prompt token ids must be in [0, {self.vocab_size}): got {bad[:5]}",
                                         "prompt")
            return list(prompt_token_ids)
        return list(self.tokenizer.encode(prompt or "", add_special_tokens=True))

    def sampling_params(self, options: SamplingOptions, entries: Sequence[Any],
                        extra_args: dict[str, Any], *, arrival_time: float | None = None) -> Any:
        """vLLM ``SamplingParams`` (delta outputs) with the gated entries activated and, beside them,
        the request's ``arrival_time`` (a client's payload or arrival in ``extra_args`` is dropped)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        kwargs: dict[str, Any] = {"n": options.n, "output_kind": RequestOutputKind.DELTA,
                                  "ignore_eos": options.ignore_eos}
        for name in ("max_tokens", "temperature", "top_p", "top_k", "seed",
                     "presence_penalty", "frequency_penalty"):
            value = getattr(options, name)
            if value is not None:
                kwargs[name] = value
        if options.stop:
            kwargs["stop"] = list(options.stop)
        extra = {k: v for k, v in extra_args.items() if k != WIRE_KEY}
        kwargs["extra_args"] = extra or None
        from vllm.exceptions import VLLMClientError

        try:
            params = SamplingParams(**kwargs)
        except (ValueError, TypeError, VLLMClientError) as err:  # vLLM's validation error is not a ValueError
            raise EngineRequestError(str(err), getattr(err, "parameter", None)) from None
        activate_logits_processors(params, entries, arrival_time=arrival_time)
        return params

    async def generate(
        self, prompt_ids: list[int], params: Any, request_id: str
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream deltas per choice, then one chunk with ``usage``.

        Errors the engine raises at admission become :class:`EngineRequestError`.
        Cancelling the consumer aborts the engine request (``AsyncLLM.generate``
        aborts on ``CancelledError``/``GeneratorExit``).
        """
        from vllm.inputs import TokensPrompt

        completion_tokens = 0
        stream = self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id)
        try:
            async for out in stream:
                for c in out.outputs:
                    completion_tokens += len(c.token_ids)
                    if c.text or c.token_ids or c.finish_reason:
                        yield GenerateChunk(index=c.index, text=c.text, token_ids=list(c.token_ids),
                                            finish_reason=c.finish_reason)
        except Exception as err:
            client_error = _client_error(err)
            if client_error is None:
                raise
            raise client_error from None
        finally:
            await stream.aclose()
        yield GenerateChunk(usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                                        total_tokens=len(prompt_ids) + completion_tokens))

    def shutdown(self) -> None:
        self.engine.shutdown()


def _client_error(err: BaseException) -> EngineRequestError | None:
    """The 400 to answer when ``err`` is the request's fault (vLLM validation, a ``ValueError``
    at admission such as the adapter's ``validate_params``), else ``None``."""
    from vllm.exceptions import VLLMClientError

    for e in (err, err.__cause__):
        if isinstance(e, (VLLMClientError, ValueError)):
            return EngineRequestError(str(e), getattr(e, "parameter", None))
    return None


def _engine_args(model: str, served_name: str, engine_args: Sequence[str], register_adapter: bool) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="dynlogits.serve.worker (engine)"))
    ns = parser.parse_args(["--model", model, "--served-model-name", served_name, *engine_args])
    args = AsyncEngineArgs.from_cli_args(ns)
    if register_adapter:
        try:
            from dynlogits.adapters.vllm import register_dynamo_logits_processor
        except ImportError:
            current = list(args.logits_processors or [])
            if ADAPTER_CLASS not in current:
                args.logits_processors = [*current, ADAPTER_CLASS]
        else:
            register_dynamo_logits_processor(args)
        if not args.worker_extension_cls:  # lets GET /stats read the adapter's per-request state
            args.worker_extension_cls = EXTENSION_CLASS
    return args


def start_vllm_engine(model: str, served_name: str, engine_args: Sequence[str], *,
                      register_adapter: bool) -> VllmEngine:
    """Build and start ``AsyncLLM`` (blocking, ~30-60 s on CPU); call from a thread."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from dynlogits.policy.engine_spec import SPEC_SOURCE_ENV, SpecSource

    # This worker resolves, gates and writes extra_args itself; its engine must not be a second source.
    os.environ[SPEC_SOURCE_ENV] = SpecSource.WORKER.value
    args = _engine_args(model, served_name, engine_args, register_adapter)
    engine = AsyncLLM.from_engine_args(args)
    mc = engine.model_config
    return VllmEngine(
        engine=engine,
        tokenizer=engine.get_tokenizer(),
        model_name=served_name,
        max_model_len=int(mc.max_model_len),
        vocab_size=int(mc.get_vocab_size()),
        adapter_registered=register_adapter,
        introspection=args.worker_extension_cls == EXTENSION_CLASS,
    )
