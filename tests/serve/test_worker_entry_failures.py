"""The worker's side of a failed request (``VllmEngine.generate``): a report from the engine's adapter,
read from a real ``ReportInbox``, ends the request with an ``EntryFailure`` naming the entry as the
client knows it, after the deltas before the position it failed at; a request that stopped on a stop
token while device checks were in flight waits for them to settle, woken by the adapter's datagrams.

The engine is a stand-in for ``AsyncLLM`` (its ``generate`` yields ``RequestOutput``-shaped deltas):
the device path it models (a row found empty on an accelerator, read back after the step) cannot run
on this CPU-only machine; ``tests/deploy/test_failures_visible.py`` runs the real engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from dynlogits.sdk.failure_reports import (  # noqa: E402
    REPORT_KEY,
    Reason,
    ReportInbox,
    ReportSender,
    RequestFailure,
)
from dynlogits.serve.protocol import GenerateChunk  # noqa: E402
from dynlogits.serve.worker.vllm_engine import VllmEngine, entry_failure  # noqa: E402

PATHS = ["deployment entries[0]", "deployment entries[1]", "logits_processors[0]", "logits_processors[1]"]
KINDS = ["banned_tokens", "reasoning", "multiple_choice", "deadline"]


@dataclass
class _Step:
    """One engine output: a delta per choice, and what the engine core sent before it (``before``)."""

    token_ids: list[int]
    text: str = ""
    finish_reason: str | None = None
    stop_reason: Any = None
    before: Callable[[], Any] = field(default=lambda: None)


class _Engine:
    """Stands in for ``AsyncLLM.generate`` (one choice, delta outputs)."""

    def __init__(self, steps: list[_Step]) -> None:
        self.steps = steps
        self.closed = False

    def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        async def outputs() -> AsyncIterator[Any]:
            try:
                for step in self.steps:
                    step.before()
                    await asyncio.sleep(0)
                    yield SimpleNamespace(outputs=[SimpleNamespace(index=0, text=step.text, token_ids=step.token_ids,
                                                                   finish_reason=step.finish_reason,
                                                                   stop_reason=step.stop_reason)])
            finally:
                self.closed = True

        return outputs()


@pytest.fixture
def inbox() -> Iterator[ReportInbox]:
    box = ReportInbox()
    yield box
    box.close()


def _run(engine: _Engine, inbox: ReportInbox) -> list[GenerateChunk]:
    worker = VllmEngine(engine=engine, tokenizer=None, model_name="m", max_model_len=64, vocab_size=32,
                        adapter_registered=True, failures=inbox)
    params = SimpleNamespace(extra_args={REPORT_KEY: "rid"})

    async def main() -> list[GenerateChunk]:
        return [c async for c in worker.generate([1, 2], params, "r", entry_paths=PATHS, entry_kinds=KINDS)]

    return asyncio.run(main())


def _failure(position: int | None, entry: int | None = 3) -> RequestFailure:
    return RequestFailure("rid", Reason.NO_TOKEN_LEFT, entry, position,
                          f"no token left to sample at output position {position}; see dynamo_logits[2]")


def test_the_client_gets_the_deltas_before_the_failing_position_then_the_failure(inbox: ReportInbox) -> None:
    """Under async scheduling the step that fails runs before the previous step's outputs leave the
    engine core: the report arrives with the output of position 0, which is still delivered."""
    sender = ReportSender(inbox.path)
    engine = _Engine([_Step([797], "hello", before=lambda: sender.send(_failure(1))),
                      _Step([1], "", "stop")])
    chunks = _run(engine, inbox)
    assert [c.text for c in chunks] == ["hello", ""]
    failure = chunks[-1].failure
    assert failure is not None and chunks[-1].finish_reason is None and not any(c.usage for c in chunks)
    assert (failure.reason, failure.param, failure.position) == ("no_token_left", "logits_processors[1]", 1)
    assert failure.message == ("logits_processors[1] (deadline): no token left to sample at output position 1; "
                               "see logits_processors[0]")
    assert engine.closed


def test_a_request_with_no_report_finishes_with_its_usage(inbox: ReportInbox) -> None:
    chunks = _run(_Engine([_Step([797], "hello"), _Step([1], "", "stop")]), inbox)
    assert [c.finish_reason for c in chunks[:-1]] == [None, "stop"] and chunks[-1].usage is not None


def test_a_stop_while_device_checks_are_in_flight_waits_for_them_to_settle(inbox: ReportInbox) -> None:
    """The adapter queued a check in the final step (progress sent then); the failure it finds is read
    back after the outputs left. The worker answers once the check settled: with the failure."""
    sender = ReportSender(inbox.path)

    def queued() -> None:
        sender.progress(queued=4, settled=3)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, sender.send, _failure(0))  # read back after the step's outputs left
        loop.call_later(0.06, sender.progress, 4, 4)

    chunks = _run(_Engine([_Step([1], "", "stop", stop_reason=None, before=queued)]), inbox)
    assert len(chunks) == 1 and chunks[0].failure is not None and chunks[0].failure.position == 0


def test_a_stop_whose_checks_settle_clean_finishes_normally(inbox: ReportInbox) -> None:
    sender = ReportSender(inbox.path)

    def queued() -> None:
        sender.progress(queued=2, settled=1)
        asyncio.get_running_loop().call_later(0.05, sender.progress, 2, 2)

    chunks = _run(_Engine([_Step([5], "a"), _Step([1], "", "stop", before=queued)]), inbox)
    assert chunks[-2].finish_reason == "stop" and chunks[-1].usage is not None


def test_a_stop_string_never_waits(inbox: ReportInbox) -> None:
    """A fail-stop writes a stop token; a stop string cannot be one, so nothing is waited for."""
    ReportSender(inbox.path).progress(queued=9, settled=0)  # never settles
    chunks = _run(_Engine([_Step([5], "a", "stop", stop_reason="a")]), inbox)
    assert chunks[0].finish_reason == "stop"


def test_an_unknown_entry_or_position_is_said_so() -> None:
    failure = entry_failure(RequestFailure("rid", Reason.NO_TOKEN_LEFT, None, None, "no token left"), PATHS, KINDS)
    assert failure.param is None and failure.message.startswith("the request's entries with the engine's own masks")
    failure = entry_failure(RequestFailure("rid", Reason.NOT_REALIZED, 9, 0, "dynamo_logits[9]: bad"), PATHS, KINDS)
    assert failure.param is None and failure.message == "the request's entries: dynamo_logits[9]: bad"
