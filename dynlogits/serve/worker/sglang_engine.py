"""The SGLang engine behind a worker (``python -m dynlogits.serve.worker --backend sglang``).

Request building is SGLang-native and tested here on CPU up to the engine call: sampling params as
SGLang's dict, the gated entries activated by ``dynlogits.adapters.sglang.activate`` (the worker's
own processor string; a client never supplies one), and SGLang's real ``GenerateReqInput``.
Starting the engine needs SGLang with its GPU dependencies (``pip install 'dynlogits[sglang]'`` on
a CUDA host); where it cannot start, ``start_sglang_engine`` raises ``SglangEngineUnavailable``
saying why, and the worker exits 1. Nothing in this project starts SGLang's engine.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynlogits.specs import WireEntry

from ..protocol import ChatMessage, GenerateChunk, SamplingOptions, Usage
from .prompts import render_prompt
from .worker_engine import EngineRequestError

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.server_args import ServerArgs

__all__ = ["SglangEngine", "SglangEngineUnavailable", "SglangHandle", "SglangRequest", "sglang_server_args",
           "start_sglang_engine"]

_NEEDS = ("the SGLang backend needs SGLang installed with its GPU dependencies (pip install 'dynlogits[sglang]' on a "
          "CUDA host with sgl-kernel)")


class SglangEngineUnavailable(RuntimeError):
    """SGLang's engine cannot start here; the message says why."""


@dataclass(frozen=True)
class SglangRequest:
    """One request's SGLang fields: the sampling-params dict and the worker's processor string."""

    sampling_params: dict[str, Any]
    custom_logit_processor: str | None

    def generate_req_input(self, prompt_ids: Sequence[int], request_id: str) -> GenerateReqInput:
        """SGLang's real ``GenerateReqInput`` for this request (streaming)."""
        from sglang.srt.managers.io_struct import GenerateReqInput

        return GenerateReqInput(rid=request_id, input_ids=list(prompt_ids), sampling_params=dict(self.sampling_params),
                                custom_logit_processor=self.custom_logit_processor, stream=True)


@dataclass
class SglangHandle:
    """Holds the started ``sglang.Engine`` (``None``: not started, or a stand-in without one)."""

    engine: Engine | None = None


@dataclass
class SglangEngine:
    """An ``sglang.Engine`` plus what the worker needs to know about its model: the SGLang
    :class:`~dynlogits.serve.worker.worker_engine.WorkerEngine` (its params: :class:`SglangRequest`)."""

    #: The engine's handle (``engine.engine`` is the ``sglang.Engine``).
    engine: SglangHandle | None
    tokenizer: Any  # see WorkerEngine.tokenizer
    model_name: str
    max_model_len: int
    vocab_size: int
    adapter_registered: bool

    @property
    def _sglang(self) -> Engine | None:
        """The ``sglang.Engine``, or ``None`` when none runs."""
        return self.engine.engine if self.engine is not None else None

    def _running(self) -> Engine:
        """The ``sglang.Engine``; ``RuntimeError`` when none runs."""
        engine = self._sglang
        if engine is None:
            raise RuntimeError("SGLang engine not started")
        return engine

    def render_prompt(self, *, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                      messages: Sequence[ChatMessage] | None) -> list[int]:
        """Token ids of the prompt (:func:`~dynlogits.serve.worker.prompts.render_prompt`)."""
        return render_prompt(self.tokenizer, self.vocab_size, prompt=prompt, prompt_token_ids=prompt_token_ids,
                             messages=messages)

    def sampling_params(self, options: SamplingOptions, entries: Sequence[WireEntry], extra_args: dict[str, Any], *,
                        arrival_time: float | None = None) -> SglangRequest:
        """SGLang sampling params with the gated entries activated and the request's ``arrival_time``
        beside them. ``extra_args`` (vLLM's ``vllm_xargs``) has no SGLang counterpart and is not forwarded."""
        from dynlogits.adapters.sglang import activate

        params: dict[str, Any] = {"n": options.n, "ignore_eos": options.ignore_eos}
        for ours, theirs in (("max_tokens", "max_new_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                             ("top_k", "top_k"), ("seed", "sampling_seed"), ("presence_penalty", "presence_penalty"),
                             ("frequency_penalty", "frequency_penalty")):
            value = getattr(options, ours)
            if value is not None:
                params[theirs] = value
        if options.stop:
            params["stop"] = list(options.stop)
        fields = activate(params, entries, arrival_time=arrival_time)
        return SglangRequest(sampling_params=params, custom_logit_processor=fields.custom_logit_processor)

    async def generate(self, prompt_ids: list[int], params: SglangRequest, request_id: str, *,
                       entry_paths: Sequence[str] = (), entry_kinds: Sequence[str] = ()
                       ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream SGLang's outputs as chunks (not run in this project: SGLang needs a GPU). The entry
        names are the worker's for a failure report, which SGLang's adapter does not send yet."""
        completion_tokens = 0
        try:
            stream = await self._running().async_generate(
                input_ids=prompt_ids, sampling_params=params.sampling_params,
                custom_logit_processor=params.custom_logit_processor, stream=True, rid=request_id)
            async for out in stream:
                ids = list(out.get("output_ids") or [])
                completion_tokens = max(completion_tokens, len(ids))
                finish = (out.get("meta_info") or {}).get("finish_reason")
                yield GenerateChunk(index=int(out.get("index", 0)), text=out.get("text", ""), token_ids=ids,
                                    finish_reason=(finish or {}).get("type") if isinstance(finish, dict) else finish)
        except ValueError as err:  # SGLang's request validation
            raise EngineRequestError(str(err)) from None
        yield GenerateChunk(usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                                        total_tokens=len(prompt_ids) + completion_tokens))

    async def abort(self, request_id: str) -> None:
        """Abort the request in SGLang's tokenizer manager (one that ended is ignored)."""
        engine = self._sglang
        if engine is not None:
            engine.tokenizer_manager.abort_request(request_id)

    async def check_health(self) -> None:
        """Raises while no ``sglang.Engine`` runs."""
        self._running()

    async def adapter_requests(self) -> int | None:
        """``None``: SGLang's adapter state is not readable from the worker."""
        return None

    def death(self) -> str | None:
        """``None``: SGLang's engine reports no death the worker can read; its requests fail instead."""
        return None

    def shutdown(self) -> None:
        """Shut the ``sglang.Engine`` down."""
        engine = self._sglang
        if engine is not None:
            engine.shutdown()


def sglang_server_args(model: str, served_name: str, engine_args: Sequence[str], *,
                       register_adapter: bool) -> ServerArgs:
    """SGLang's ``ServerArgs`` from the worker's engine flags, with the adapter enabled
    (``--enable-custom-logit-processor``; speculative decoding and watermarking refused)."""
    from sglang.srt.server_args import ServerArgs

    from dynlogits.adapters.sglang import enable_adapter

    parser = argparse.ArgumentParser(prog="dynlogits.serve.worker (sglang engine)")
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(["--model-path", model, "--served-model-name", served_name,
                                                              *engine_args]))
    return enable_adapter(server_args) if register_adapter else server_args


def start_sglang_engine(model: str, served_name: str, engine_args: Sequence[str], *, register_adapter: bool) -> SglangEngine:
    """Start ``sglang.Engine`` (blocking); ``SglangEngineUnavailable`` when it cannot start here."""
    from dynlogits.adapters.sglang import UnsupportedEngineConfig, sglang_engine_env

    for key, value in sglang_engine_env().items():
        os.environ.setdefault(key, value)
    try:
        from sglang.srt.entrypoints.engine import Engine

        server_args = sglang_server_args(model, served_name, engine_args, register_adapter=register_adapter)
    except UnsupportedEngineConfig:
        raise
    except (Exception, SystemExit) as err:
        raise SglangEngineUnavailable(f"SGLang cannot be loaded on this machine ({type(err).__name__}: {err}); {_NEEDS}") from err
    try:
        engine = Engine(server_args=server_args)
    except (Exception, SystemExit) as err:
        raise SglangEngineUnavailable(f"SGLang's engine could not start ({type(err).__name__}: {err}); {_NEEDS}") from err
    tokenizer = engine.tokenizer_manager.tokenizer
    config = engine.tokenizer_manager.model_config
    return SglangEngine(engine=SglangHandle(engine), tokenizer=tokenizer, model_name=served_name,
                        max_model_len=int(config.context_len), vocab_size=int(config.vocab_size),
                        adapter_registered=register_adapter)
