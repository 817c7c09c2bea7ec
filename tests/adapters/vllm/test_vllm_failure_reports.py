"""The vLLM adapter reports a failed request to the worker's inbox inside the engine call that finds
the failure (so before that step's outputs leave vLLM's engine core), naming the failing entry by its
index in the payload and the output position. vLLM's real V1 classes (``BatchUpdateBuilder``, a real
``VllmConfig``) on the CPU, where the V1 runner is the one that runs; no engine started."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.sdk import failure_reports  # noqa: E402
from dynlogits.sdk.failure_reports import REPORT_KEY, SOCKET_ENV, Reason, ReportInbox  # noqa: E402
from dynlogits.sdk.readback import INBOX  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

EOS = 1
HELLO, WORLD = 797, 561
BAN = {"kind": "banned_tokens", "token_ids": [735, 450]}  # as an operator's entry would be
REASONING = {"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]}
CHOICE = {"kind": "multiple_choice", "choices": [[HELLO, WORLD]], "eos_token_id": EOS}


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReportInbox]:
    """A worker's inbox, named in the environment as the worker names it for its engine."""
    box = ReportInbox()
    monkeypatch.setenv(SOCKET_ENV, box.path)
    failure_reports._reset_sender()
    yield box
    failure_reports._reset_sender()
    INBOX.on_progress = None
    box.close()


def _params(payload: list[dict[str, Any]], report_id: str | None = "req-1") -> Any:
    extra: dict[str, Any] = {WIRE_KEY: payload}
    if report_id is not None:
        extra[REPORT_KEY] = report_id
    params = SamplingParams(temperature=0.0, max_tokens=16, extra_args=extra)
    params.update_from_generation_config({}, eos_token_id=EOS)  # as vLLM's input processor does
    return params


def _add(proc: DynamoVllmLogitsProcessor, params: Any, output: list[int], prompt: list[int] | None = None) -> None:
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, prompt or [2, 3, 4], output))
    proc.update_state(builder.get_and_reset(1))


def _step(proc: DynamoVllmLogitsProcessor, output: list[int], width: int) -> int:
    """One step as vLLM makes it: ``apply`` on the batch's logits, then the sampled token appended."""
    logits = proc.apply(torch.zeros(1, width))
    token = int(logits[0].argmax())
    output.append(token)
    proc.update_state(None)
    return token


def test_an_expired_deadline_beside_a_choice_is_reported_in_the_step_that_finds_it(vllm_config, inbox) -> None:
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    output: list[int] = []
    _add(proc, _params([BAN, REASONING, CHOICE, {"kind": "deadline", "seconds": 1e-9}]), output)
    assert inbox.take("req-1") is None
    assert _step(proc, output, proc.vocab_size) == EOS  # fail-stopped
    failure = inbox.take("req-1")  # no wait: it was sent before apply returned
    assert failure is not None
    assert (failure.reason, failure.entry, failure.position) == (Reason.NO_TOKEN_LEFT, 3, 0)


def test_a_trigger_whose_phrase_the_choice_does_not_go_on_with_is_reported_at_its_position(vllm_config, inbox) -> None:
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    output: list[int] = []
    trigger = {"kind": "trigger", "trigger_token_ids": [HELLO], "phrase_token_ids": [7], "scope": "answer"}
    _add(proc, _params([BAN, REASONING, CHOICE, trigger]), output)
    assert _step(proc, output, proc.vocab_size) == HELLO and inbox.take("req-1") is None
    assert _step(proc, output, proc.vocab_size) == EOS
    failure = inbox.take("req-1")
    assert failure is not None and (failure.reason, failure.entry, failure.position) == (Reason.NO_TOKEN_LEFT, 3, 1)


def test_entries_not_realized_are_reported_when_the_request_enters_the_batch(vllm_config, inbox) -> None:
    """A ``prompt_tokens`` restrict whose prompt holds none of the choice's tokens: refused at realization,
    reported before the request's first row is even applied."""
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    output: list[int] = []
    _add(proc, _params([BAN, CHOICE, {"kind": "prompt_tokens", "mode": "restrict"}]), output, prompt=[2, 3, 4])
    failure = inbox.take("req-1")
    assert failure is not None
    assert (failure.reason, failure.entry, failure.position) == (Reason.NOT_REALIZED, 2, 0)
    assert "dynamo_logits[1]" in failure.detail  # the other entry, named for the worker to rename
    assert _step(proc, output, proc.vocab_size) == EOS


def test_a_request_without_a_report_id_or_an_engine_without_an_inbox_reports_nothing(vllm_config, inbox,
                                                                                      monkeypatch) -> None:
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    output: list[int] = []
    _add(proc, _params([CHOICE, {"kind": "deadline", "seconds": 1e-9}], report_id=None), output)
    _step(proc, output, proc.vocab_size)
    assert inbox.drain() == 0 and len(proc.failures) == 1  # logged and kept, not reported

    monkeypatch.delenv(SOCKET_ENV)
    failure_reports._reset_sender()
    served = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)  # as under ``vllm serve``
    assert served.reports is None
    output = []
    _add(served, _params([CHOICE, {"kind": "deadline", "seconds": 1e-9}]), output)
    _step(served, output, served.vocab_size)
    assert inbox.drain() == 0 and len(served.failures) == 1


def test_a_healthy_request_reports_nothing(vllm_config, inbox) -> None:
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    output: list[int] = []
    _add(proc, _params([BAN, CHOICE]), output)
    while not output or output[-1] != EOS:
        _step(proc, output, proc.vocab_size)
    assert output == [HELLO, WORLD, EOS] and inbox.drain() == 0
