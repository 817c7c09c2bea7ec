"""The failure-report channel (``dynlogits.sdk.failure_reports``) over real Unix datagram sockets, the
read-back progress it waits on (``dynlogits.sdk.readback``), and the failures as data that the
guard records (``dynlogits.sdk.guard``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from collections.abc import Iterator

import pytest
import torch

from dynlogits.processors.request import RequestLogitsProcessor
from dynlogits.sdk import GuardedRequest, apply_row, realize
from dynlogits.sdk.failure_reports import (
    MAX_DATAGRAM,
    REPORT_KEY,
    SOCKET_ENV,
    Progress,
    Reason,
    ReportInbox,
    ReportSender,
    RequestFailure,
    decode,
    entry_in_reason,
    processor_entries,
    put_report_id,
    render_paths,
    report_id_of,
)
from dynlogits.sdk.guard import NO_TOKEN_LEFT, Failure
from dynlogits.sdk.readback import Inbox


@pytest.fixture
def inbox() -> Iterator[ReportInbox]:
    box = ReportInbox(capacity=4)
    yield box
    box.close()


def _failure(request: str = "r1", **kwargs: object) -> RequestFailure:
    fields = {"reason": Reason.NO_TOKEN_LEFT, "entry": 3, "position": 7, "detail": "no token left at output position 7"}
    return RequestFailure(request, **{**fields, **kwargs})  # type: ignore[arg-type]


def test_a_report_sent_is_in_the_inbox_when_send_returns(inbox: ReportInbox) -> None:
    """No wait, no retry: one non-blocking read right after the send finds it (the ordering the worker relies on)."""
    sender = ReportSender.from_env(inbox.environ())
    assert sender is not None
    assert sender.send(_failure("abc")) and sender.sent == 1
    assert inbox.take("abc") == _failure("abc")
    assert inbox.take("abc") is None  # taken once


def test_the_inbox_lives_in_a_directory_only_its_user_enters(inbox: ReportInbox) -> None:
    directory = os.path.dirname(inbox.path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(inbox.path).st_mode)
    inbox.close()
    assert not os.path.exists(directory)


def test_reports_nobody_takes_are_bounded_oldest_first(inbox: ReportInbox) -> None:
    sender = ReportSender(inbox.path)
    for i in range(6):
        sender.send(_failure(f"r{i}"))
    inbox.drain()
    assert (inbox.received, inbox.evicted) == (6, 2)
    assert inbox.take("r0") is None and inbox.take("r1") is None and inbox.take("r5") is not None


def test_the_first_report_of_a_request_is_kept(inbox: ReportInbox) -> None:
    """Under tensor parallelism every rank reports the same failure; a later one changes nothing."""
    sender = ReportSender(inbox.path)
    sender.send(_failure("same", position=1))
    sender.send(_failure("same", position=9))
    taken = inbox.take("same")
    assert taken is not None and taken.position == 1


def test_a_long_detail_is_cut_to_fit_one_datagram(inbox: ReportInbox) -> None:
    sender = ReportSender(inbox.path)
    sender.send(_failure("long", detail="\u00e9" * 50_000))
    taken = inbox.take("long")
    assert taken is not None and taken.detail.endswith("...") and len(taken.encode()) <= MAX_DATAGRAM


def test_anything_but_a_report_is_ignored(inbox: ReportInbox) -> None:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for junk in [b"", b"\xff\xfe", b"[]", b'{"t": "failure", "id": "../x", "reason": "no_token_left"}',
                 b'{"t": "failure", "id": "ok", "reason": "made_up"}', b'{"t": "progress", "pid": -1}']:
        raw.sendto(junk, inbox.path)
    raw.close()
    assert inbox.drain() == 6 and inbox.received == 0 and inbox.unsettled() == {}
    assert decode(b'{"t": "failure", "id": "ok", "reason": "not_realized", "entry": true}') == RequestFailure(
        "ok", Reason.NOT_REALIZED, None, None, "")


def test_a_sender_never_blocks_or_raises_when_the_inbox_is_gone_or_full(caplog: pytest.LogCaptureFixture) -> None:
    box = ReportInbox(receive_buffer=4096)
    sender = ReportSender(box.path)
    with caplog.at_level(logging.ERROR, "dynlogits.sdk"):
        sent = [sender.send(_failure(f"r{i}", detail="x" * 1500)) for i in range(200)]  # fills the receive buffer
        assert sent[0] and not all(sent) and sender.dropped == sent.count(False)
        box.close()
        assert not sender.send(_failure("late"))
    assert sender.dropped == sent.count(False) + 1
    logged = [r.getMessage() for r in caplog.records if "could not report to the worker's inbox" in r.getMessage()]
    assert len(logged) == 2 and "BlockingIOError" in logged[0] and "FileNotFoundError" in logged[1]  # once per kind


def test_only_an_absolute_socket_path_from_the_environment_makes_a_sender(caplog: pytest.LogCaptureFixture) -> None:
    assert ReportSender.from_env({}) is None
    with caplog.at_level(logging.ERROR, "dynlogits.sdk"):
        assert ReportSender.from_env({SOCKET_ENV: "relative/inbox"}) is None
        assert ReportSender.from_env({SOCKET_ENV: "/" + "x" * 200}) is None
    assert len(caplog.records) == 2


def test_report_ids_are_short_tokens_and_a_bad_one_is_never_echoed() -> None:
    extra: dict[str, object] = {REPORT_KEY: "a client's ../../etc"}
    assert report_id_of(extra) is None
    put_report_id(extra, "abc_DEF-1")
    assert report_id_of(extra) == "abc_DEF-1"
    with pytest.raises(ValueError):
        put_report_id(extra, "no spaces")
    put_report_id(extra, None)
    assert REPORT_KEY not in extra


def test_entries_are_named_by_their_payload_index() -> None:
    payload = [{"kind": "banned_tokens", "token_ids": [1]}, {"kind": "reasoning", "start_token_ids": [5],
                                                             "end_token_ids": [6]}, {"kind": "deadline", "seconds": 1}]
    assert processor_entries(payload) == [0, 2]
    assert processor_entries('[{"kind": "deadline"}]') is None
    assert entry_in_reason("entries not realized: dynamo_logits[4]: contradicts dynamo_logits[3]") == 4
    assert render_paths("dynamo_logits[1]: beside dynamo_logits[0] and dynamo_logits[9]",
                        ["deployment entries[0]", "logits_processors[0]"]) == (
        "logits_processors[0]: beside deployment entries[0] and dynamo_logits[9]")


def test_processor_entries_follows_realization() -> None:
    """One processor per entry but ``reasoning``: the rule ``processor_entries`` mirrors."""
    payload = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [6]},
               {"kind": "banned_tokens", "token_ids": [1], "scope": "answer"}, {"kind": "logit_bias", "bias": {"2": 1.0}}]
    request = realize(payload, vocab_size=64, stop_token_id=0)
    assert request is not None and request.processor is not None
    assert len(request.processor.processors) == len(processor_entries(payload) or ())


# -- waiting for device checks to settle ------------------------------------------------------------


def test_settled_waits_for_the_checks_queued_then_and_returns_a_failure_that_came_first(inbox: ReportInbox) -> None:
    sender = ReportSender(inbox.path)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sender.progress(queued=3, settled=1)
        checks = inbox.unsettled()
        assert checks == {os.getpid(): 3}
        loop.call_later(0.05, sender.progress, 4, 2)  # not yet: 2 < 3
        loop.call_later(0.1, sender.progress, 4, 3)
        assert await asyncio.wait_for(inbox.settled("r", checks, timeout=30), 10) is None
        assert inbox.unsettled() == {os.getpid(): 4}

        loop.call_later(0.05, sender.send, _failure("r"))  # reported before its check settled
        got = await asyncio.wait_for(inbox.settled("r", inbox.unsettled(), timeout=30), 10)
        assert got == _failure("r")

    asyncio.run(main())


def test_settled_gives_up_after_its_timeout_and_says_so(inbox: ReportInbox, caplog: pytest.LogCaptureFixture) -> None:
    ReportSender(inbox.path).progress(queued=2, settled=0)

    async def main() -> RequestFailure | None:
        return await inbox.settled("r", inbox.unsettled(), timeout=0.05)

    with caplog.at_level(logging.WARNING, "dynlogits.sdk"):
        assert asyncio.run(main()) is None
    assert "did not settle" in caplog.text


def test_readback_counts_device_copies_queued_and_settled_in_order() -> None:
    """``on_progress`` when a copy is queued (in the call that queues it) and when the settled count grows
    past every older copy; a CPU copy runs at once and is not counted."""
    inbox = Inbox(period=60.0)
    inbox.watching = False
    seen: list[tuple[int, int]] = []
    inbox.on_progress = lambda queued, settled: seen.append((queued, settled))
    landed = {1: False, 2: False}
    ran: list[int] = []
    device = torch.device("meta")  # any device but the CPU reads back later
    for n in (1, 2):
        inbox.when_landed(lambda n=n: landed[n], lambda n=n: ran.append(n), device)
    inbox.when_landed(lambda: True, lambda: ran.append(0), torch.device("cpu"))
    assert seen == [(1, 0), (2, 0)] and ran == [0]
    landed[2] = True
    inbox.drain()
    assert ran == [0, 2] and seen == [(1, 0), (2, 0)]  # copy 1 is older and still out: nothing settled
    landed[1] = True
    inbox.drain()
    assert ran == [0, 2, 1] and seen[-1] == (2, 2) and (inbox.queued, inbox.settled) == (2, 2)


# -- failures as data (dynlogits.sdk.guard) ----------------------------------------------------------


class _Raises:
    def __call__(self, input_ids, logits):  # noqa: ANN001, ANN204
        raise RuntimeError("boom")


class _Keeps:
    def __init__(self, keep: int) -> None:
        self.keep = keep

    def __call__(self, input_ids, logits):  # noqa: ANN001, ANN204
        kept = logits[self.keep].clone()
        logits.fill_(float("-inf"))
        logits[self.keep] = kept


def test_a_failure_is_recorded_once_as_data_and_handed_to_on_failure() -> None:
    request = GuardedRequest(RequestLogitsProcessor([_Keeps(1)]), stop_token_id=0)
    handed: list[Failure | None] = []
    request.on_failure = lambda r: handed.append(r.failure)
    request.fail(NO_TOKEN_LEFT.format(n=5))
    request.fail(NO_TOKEN_LEFT.format(n=9))
    assert handed == [Failure(Reason.NO_TOKEN_LEFT, NO_TOKEN_LEFT.format(n=5), 5, None)]


def test_a_raising_processor_is_named_with_its_position() -> None:
    request = GuardedRequest(RequestLogitsProcessor([_Keeps(1), _Raises()]), stop_token_id=0)
    row = apply_row(request, [4, 4], torch.zeros(4))
    assert row.tolist() == [0.0, float("-inf"), float("-inf"), float("-inf")]  # fail-stopped to its stop token
    assert request.failure is not None
    assert (request.failure.reason, request.failure.position, request.failure.processor) == (
        Reason.PROCESSOR_ERROR, 2, 1)


def test_a_position_the_caller_does_not_know_is_never_named_as_zero() -> None:
    request = GuardedRequest(RequestLogitsProcessor([_Raises()]), stop_token_id=0)
    request.fail_with(RuntimeError("x"), None)
    assert request.failure is not None and request.failure.position is None
    assert "output position 0" not in (request.error or "") and "not known" in (request.error or "")


def test_blame_names_the_first_processor_after_which_no_token_is_left() -> None:
    request = GuardedRequest(RequestLogitsProcessor([_Keeps(2), _Keeps(2), _Keeps(3), _Keeps(1)]), stop_token_id=0)
    assert request.blame([], vocab_size=8) == 2
    alone = GuardedRequest(RequestLogitsProcessor([_Keeps(2)]), stop_token_id=0)
    assert alone.blame([], vocab_size=8) is None  # the engine's own masks took part


def test_a_request_not_realized_fails_before_its_first_row() -> None:
    request = GuardedRequest.failed_at_realization("payload rejected in the engine: dynamo_logits[2]: too wide",
                                                   stop_token_id=0, report=None)
    assert request.failure is not None
    assert (request.failure.reason, request.failure.position) == (Reason.NOT_REALIZED, 0)


def test_progress_records_round_trip() -> None:
    assert decode(Progress(12, 5, 3).encode()) == Progress(12, 5, 3)
