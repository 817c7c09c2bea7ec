"""The vLLM engine behind a worker: construction, prompt rendering, streaming generation.

Imports vLLM lazily (inside :func:`start_vllm_engine`) so the rest of the worker
package stays importable without an engine.

Failed requests: the worker opens a ``ReportInbox`` before it starts ``AsyncLLM`` (whose engine core
runs in processes of its own that inherit the inbox's path), marks each request that activates
entries with a report id, and ends a request the adapter reported failed with a chunk carrying an
:class:`EntryFailure` instead of its finish (``dynlogits.sdk.failure_reports``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynlogits.sdk.activation import activate_logits_processors
from dynlogits.sdk.failure_reports import (
    REPORT_KEY,
    Reason,
    ReportInbox,
    RequestFailure,
    new_report_id,
    put_report_id,
    render_paths,
    report_id_of,
)
from dynlogits.specs import WIRE_KEY, WireEntry

from ..protocol import ChatMessage, EntryFailure, GenerateChunk, SamplingOptions, Usage
from .introspect import EXTENSION_CLASS, adapter_requests
from .prompts import render_prompt
from .worker_engine import EngineRequestError

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["ADAPTER_CLASS", "SETTLE_TIMEOUT_S", "VllmEngine", "entry_failure", "start_vllm_engine"]

log = logging.getLogger("dynlogits.serve.worker")

ADAPTER_CLASS = "dynlogits.adapters.vllm:DynamoVllmLogitsProcessor"
#: The longest a finished request waits for the engine's device checks to settle (a safety net: they
#: settle within an engine step, or the read-back watcher's period once the engine is idle).
SETTLE_TIMEOUT_S = 5.0


@dataclass
class VllmEngine:
    """A started ``AsyncLLM`` plus what the worker needs to know about its model: the vLLM
    :class:`~dynlogits.serve.worker.worker_engine.WorkerEngine` (its params: vLLM's ``SamplingParams``)."""

    #: The started engine (tests stand in for it with its ``generate``, ``abort``, ``check_health``, ``errored``).
    engine: AsyncLLM
    tokenizer: Any  # see WorkerEngine.tokenizer
    model_name: str
    max_model_len: int
    vocab_size: int
    adapter_registered: bool
    #: Whether ``AdapterIntrospection`` is mixed into the engine's workers (``GET /stats`` asks
    #: them for the adapter's state only then: elsewhere the call raises inside the engine).
    introspection: bool = False
    #: Where the engine's adapter reports failed requests (``None``: no adapter, nothing reported).
    failures: ReportInbox | None = None

    def render_prompt(self, *, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                      messages: Sequence[ChatMessage] | None) -> list[int]:
        """Token ids of the prompt (:func:`~dynlogits.serve.worker.prompts.render_prompt`)."""
        return render_prompt(self.tokenizer, self.vocab_size, prompt=prompt, prompt_token_ids=prompt_token_ids,
                             messages=messages)

    def sampling_params(self, options: SamplingOptions, entries: Sequence[WireEntry],
                        extra_args: dict[str, Any], *, arrival_time: float | None = None) -> SamplingParams:
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
        extra = {k: v for k, v in extra_args.items() if k not in (WIRE_KEY, REPORT_KEY)}
        kwargs["extra_args"] = extra or None
        from vllm.exceptions import VLLMClientError

        try:
            params = SamplingParams(**kwargs)
        except (ValueError, TypeError, VLLMClientError) as err:  # vLLM's validation error is not a ValueError
            raise EngineRequestError(str(err), getattr(err, "parameter", None)) from None
        activated = activate_logits_processors(params, entries, arrival_time=arrival_time)
        if entries and self.failures is not None and activated is not None:
            put_report_id(activated, new_report_id())  # only the worker names a request's reports
        return params

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, *,
        entry_paths: Sequence[str] = (), entry_kinds: Sequence[str] = (),
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream deltas per choice, then one chunk with ``usage``; or, for a request the adapter
        reported failed, the deltas before the position it failed at, then one chunk with its
        :class:`EntryFailure` (naming the entry by ``entry_paths``, the payload's entries as the client
        knows them, and ``entry_kinds``), and nothing more: the engine request is aborted.

        The report of a failure found on the host is in the inbox before the engine sends the outputs
        of the step that found it, so each output looks it up without waiting. A request that stopped
        on a stop token while the engine's device checks were in flight (a row found empty on an
        accelerator is read back later) is answered once the checks queued by then settled.

        Errors the engine raises at admission become :class:`EngineRequestError`.
        Cancelling the consumer aborts the engine request (``AsyncLLM.generate``
        aborts on ``CancelledError``/``GeneratorExit``).
        """
        from vllm.inputs import TokensPrompt

        report_id = report_id_of(params) if self.failures is not None else None
        inbox = self.failures if report_id is not None else None  # set: so is report_id
        failure: RequestFailure | None = None
        written: dict[int, int] = {}  # per choice, the tokens streamed so far
        completion_tokens = 0
        stream = self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params, request_id)
        try:
            async for out in stream:
                if inbox is not None and report_id is not None and failure is None:
                    failure = inbox.take(report_id)
                for c in out.outputs:
                    start = written.get(c.index, 0)
                    written[c.index] = start + len(c.token_ids)
                    completion_tokens += len(c.token_ids)
                    if (inbox is not None and report_id is not None and failure is None and c.finish_reason == "stop"
                            and not isinstance(c.stop_reason, str)):  # on a stop token: a fail-stop writes one
                        checks = inbox.unsettled()
                        if checks:
                            failure = await inbox.settled(report_id, checks, SETTLE_TIMEOUT_S)
                    if failure is None:
                        if c.text or c.token_ids or c.finish_reason:
                            yield GenerateChunk(index=c.index, text=c.text, token_ids=list(c.token_ids),
                                                finish_reason=c.finish_reason)
                        continue
                    position = failure.position
                    if position is not None and start < position and (c.text or c.token_ids):
                        yield GenerateChunk(index=c.index, text=c.text, token_ids=list(c.token_ids))
                    if c.finish_reason or position is None or start + len(c.token_ids) > position:
                        yield GenerateChunk(index=c.index, failure=entry_failure(failure, entry_paths, entry_kinds))
                        return
            if failure is not None:  # reported, and the stream ended before the position it names
                yield GenerateChunk(failure=entry_failure(failure, entry_paths, entry_kinds))
                return
        except Exception as err:
            client_error = _client_error(err)
            if client_error is None:
                raise
            raise client_error from None
        finally:
            await stream.aclose()
            if inbox is not None and report_id is not None:
                inbox.forget(report_id)
        yield GenerateChunk(usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                                        total_tokens=len(prompt_ids) + completion_tokens))

    async def abort(self, request_id: str) -> None:
        """Abort the engine request (``AsyncLLM.abort``; one that ended is ignored)."""
        await self.engine.abort(request_id)

    async def check_health(self) -> None:
        """``AsyncLLM.check_health``: raises once the engine core is gone."""
        await self.engine.check_health()

    async def adapter_requests(self) -> int | None:
        """The adapter's held requests, read from the engine's workers (``introspect``) where they have
        the extension; ``None`` elsewhere or when they do not answer in time."""
        return await adapter_requests(self.engine) if self.introspection else None

    def death(self) -> str | None:
        """Why ``AsyncLLM`` died (``errored``, its ``dead_error``), or ``None`` while it lives."""
        if not getattr(self.engine, "errored", False):
            return None
        cause = getattr(self.engine, "dead_error", None)
        return f"{type(cause).__name__}: {cause}" if cause is not None else "engine errored"

    def shutdown(self) -> None:
        """Shut ``AsyncLLM`` down, then close the failure reports' inbox."""
        self.engine.shutdown()
        if self.failures is not None:
            self.failures.close()


def entry_failure(failure: RequestFailure, paths: Sequence[str], kinds: Sequence[str]) -> EntryFailure:
    """The client's view of ``failure``: the entry named by its path (``paths[i]`` for payload entry
    ``i``, and so in the detail, where the adapter writes ``dynamo_logits[i]``) and kind."""
    entry = failure.entry
    param = paths[entry] if entry is not None and entry < len(paths) else None
    if param is not None:
        kind = kinds[entry] if entry is not None and entry < len(kinds) else None
        where = f"{param} ({kind})" if kind else param
    elif failure.reason is Reason.NO_TOKEN_LEFT:
        where = "the request's entries with the engine's own masks"
    else:
        where = "the request's entries"
    return EntryFailure(reason=failure.reason.value, message=f"{where}: {render_paths(failure.detail, paths)}",
                        param=param, position=failure.position)


def _client_error(err: BaseException) -> EngineRequestError | None:
    """The 400 to answer when ``err`` is the request's fault (vLLM validation, a ``ValueError``
    at admission such as the adapter's ``validate_params``), else ``None``."""
    from vllm.exceptions import VLLMClientError

    for e in (err, err.__cause__):
        if isinstance(e, (VLLMClientError, ValueError)):
            return EngineRequestError(str(e), getattr(e, "parameter", None))
    return None


def _engine_args(model: str, served_name: str, engine_args: Sequence[str], register_adapter: bool) -> AsyncEngineArgs:
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
    """Build and start ``AsyncLLM`` (blocking, for as long as the model takes to load); call from a thread."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from dynlogits.policy.engine_spec import SPEC_SOURCE_ENV, SpecSource

    # This worker resolves, gates and writes extra_args itself; its engine must not be a second source.
    os.environ[SPEC_SOURCE_ENV] = SpecSource.WORKER.value
    args = _engine_args(model, served_name, engine_args, register_adapter)
    # The engine core runs in processes of its own (AsyncLLM -> EngineCoreClient.make_async_mp_client),
    # which inherit this environment: the adapter there reports failed requests to this inbox.
    failures = ReportInbox() if register_adapter else None
    if failures is not None:
        os.environ.update(failures.environ())
    try:
        engine = AsyncLLM.from_engine_args(args)
    except BaseException:
        if failures is not None:
            failures.close()
        raise
    mc = engine.model_config
    return VllmEngine(
        engine=engine,
        tokenizer=engine.get_tokenizer(),
        model_name=served_name,
        max_model_len=int(mc.max_model_len),
        vocab_size=int(mc.get_vocab_size()),
        adapter_registered=register_adapter,
        introspection=args.worker_extension_cls == EXTENSION_CLASS,
        failures=failures,
    )
