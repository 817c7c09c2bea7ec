"""Failure reports: how the adapter inside an engine tells the worker that started a request that the
request's entries failed, so that the worker can answer its client with an error (never a plain stop).

The adapter finds a failure inside the engine's processes (``dynlogits.sdk.guard``: an entry not
realized, a processor that raised, a row left with no token), but the client is answered by the
worker, another process. The channel between them:

* The worker opens a :class:`ReportInbox` before it starts its engine: a Unix datagram socket in a
  fresh directory only its user can enter, named in ``DYN_LOGITS_FAILURE_SOCKET`` (:data:`SOCKET_ENV`)
  of the environment the engine's processes inherit. It marks each request with a report id of its
  own making (``extra_args[REPORT_KEY]``: :func:`put_report_id`; a caller's value is overwritten).
* The adapter's :class:`ReportSender` (one per process, :func:`sender`) sends a failed request's
  :class:`RequestFailure` (report id, failing entry's index in the payload, output position, reason)
  as one datagram to exactly that path. Nothing a request carries chooses where: without the
  variable there is no sender and nothing is sent (``vllm serve``); the report id is echoed only when
  it is a short token of :data:`REPORT_ID` characters. Bounded: a datagram holds at most
  :data:`MAX_DATAGRAM` bytes (the detail is cut), sends never block (a full inbox drops the report,
  counted and logged), and the inbox keeps at most ``capacity`` reports no request has taken.

Ordering, so that the worker never polls on a timer: a datagram on a Unix socket is in the
receiver's queue when ``send`` returns. A failure found on the host (realization when the request
enters the batch, a processor raising, a row found empty on the CPU) is reported inside the engine
call that finds it, and vLLM makes that call before the step's outputs leave its engine core
(``EngineCore.step`` / ``step_with_batch_queue``: ``execute_model`` and ``sample_tokens``, then
``scheduler.update_from_output``, then the output queue); so when the worker holds the request's
output, one non-blocking read of the inbox finds the report (:meth:`ReportInbox.take`).

A row found empty on an accelerator is read back later (``dynlogits.sdk.readback``): the adapter then
also sends :class:`Progress` datagrams, the number of device checks its process has queued (sent
in the step that queues one, so before that step's outputs) and the number settled (sent after the
failures they found were reported). A request whose last token is the one a fail-stop writes, on an
engine with checks in flight, is answered once the checks queued by then have settled
(:meth:`ReportInbox.settled`: woken by the datagrams, bounded by a timeout only as a safety net)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dynlogits.specs import WIRE_KEY
from dynlogits.specs.builtin import BUILTIN

__all__ = ["MAX_DATAGRAM", "REPORT_ID", "REPORT_KEY", "SOCKET_ENV", "Progress", "Reason", "ReportInbox",
           "ReportSender", "RequestFailure", "decode", "entry_in_reason", "new_report_id", "processor_entries",
           "put_report_id", "render_paths", "report_id_of", "sender"]

logger = logging.getLogger("dynlogits.sdk")

#: The environment variable naming the worker's inbox (an absolute path to a Unix datagram socket).
SOCKET_ENV = "DYN_LOGITS_FAILURE_SOCKET"
#: The ``extra_args`` key of a request's report id, written by the worker beside the payload.
REPORT_KEY = "dynamo_logits_report"
#: What a report id may be: the adapter echoes nothing else.
REPORT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The most bytes one datagram carries (a report's detail is cut to fit).
MAX_DATAGRAM = 4096
_MAX_DETAIL = 2048
_SUN_PATH_MAX = 107  # Linux sockaddr_un.sun_path, less its terminating NUL


class Reason(str, Enum):
    """Why a request failed (a metrics label and the error's ``code``)."""

    #: a step left the request's row with no token to sample (its entries, or the engine's masks with them)
    NO_TOKEN_LEFT = "no_token_left"
    #: an entry could not be realized for this request in the engine (what admission cannot know)
    NOT_REALIZED = "not_realized"
    #: a processor (or the adapter) raised
    PROCESSOR_ERROR = "processor_error"


@dataclass(frozen=True)
class RequestFailure:
    """One failed request, as the adapter reports it: ``request`` the worker's report id, ``entry`` the
    failing entry's index in the request's payload (``None``: not known), ``position`` the output
    position of the row it failed at (``None``: not known), ``detail`` the adapter's one-line reason
    (paths in it name the payload as ``dynamo_logits[i]``)."""

    request: str
    reason: Reason
    entry: int | None
    position: int | None
    detail: str

    def encode(self) -> bytes:
        """The datagram: JSON, at most ``MAX_DATAGRAM`` bytes (the detail cut, with ``...``, to fit)."""
        detail, keep = self.detail, _MAX_DETAIL
        while True:
            if len(detail) > keep:
                detail = self.detail[: keep - 3] + "..."
            data = json.dumps({"t": "failure", "id": self.request, "reason": self.reason.value, "entry": self.entry,
                               "position": self.position, "detail": detail}, separators=(",", ":"),
                              ensure_ascii=False).encode()
            if len(data) <= MAX_DATAGRAM:
                return data
            keep = min(keep, len(detail)) // 2  # a character takes at most 6 bytes escaped: a few rounds


@dataclass(frozen=True)
class Progress:
    """One engine process's device checks (``dynlogits.sdk.readback``): how many it has queued and how
    many have settled (their failures, if any, reported before this)."""

    pid: int
    queued: int
    settled: int

    def encode(self) -> bytes:
        return json.dumps({"t": "progress", "pid": self.pid, "queued": self.queued, "settled": self.settled},
                          separators=(",", ":")).encode()


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def decode(data: bytes) -> RequestFailure | Progress | None:
    """A datagram's record, or ``None`` for anything else (never raises)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    if obj.get("t") == "progress":
        pid, queued, settled = (_int_or_none(obj.get(k)) for k in ("pid", "queued", "settled"))
        return None if pid is None or queued is None or settled is None else Progress(pid, queued, settled)
    request, reason, detail = obj.get("id"), obj.get("reason"), obj.get("detail")
    if obj.get("t") != "failure" or not isinstance(request, str) or not REPORT_ID.fullmatch(request):
        return None
    try:
        why = Reason(reason)
    except ValueError:
        return None
    return RequestFailure(request, why, _int_or_none(obj.get("entry")), _int_or_none(obj.get("position")),
                          detail if isinstance(detail, str) else "")


# -- the request's report id ------------------------------------------------------------------------


def put_report_id(extra_args: MutableMapping[str, Any], report_id: str | None) -> None:
    """Write ``report_id`` into a request's ``extra_args`` (``None``: remove any, whoever wrote it)."""
    if report_id is None:
        extra_args.pop(REPORT_KEY, None)
    else:
        if not REPORT_ID.fullmatch(report_id):
            raise ValueError(f"a report id is 1-64 of [A-Za-z0-9_-], not {report_id!r}")
        extra_args[REPORT_KEY] = report_id


def report_id_of(params: Any) -> str | None:
    """The report id a request carries (``SamplingParams.extra_args`` or a mapping), or ``None`` when it
    carries none or something that is not one."""
    extra = params if isinstance(params, Mapping) else getattr(params, "extra_args", None)
    value = extra.get(REPORT_KEY) if isinstance(extra, Mapping) else None
    return value if isinstance(value, str) and REPORT_ID.fullmatch(value) else None


# -- which entry -------------------------------------------------------------------------------------

_WIRE_PATH = re.compile(re.escape(WIRE_KEY) + r"\[(\d+)\]")


def entry_in_reason(detail: str) -> int | None:
    """The payload index of the first ``dynamo_logits[i]`` a failure's detail names: the entry a
    realization error is about (``SpecError`` messages start with their first problem's path)."""
    match = _WIRE_PATH.search(detail)
    return int(match.group(1)) if match else None


def processor_entries(payload: Any) -> list[int] | None:
    """For each processor realization builds from a list ``payload``, its entry's index: every entry
    but those of a built-in kind declared without a factory (the delimiters' kind builds none), in
    order (``dynlogits.sdk.realization.build_request_processor``). ``None`` for anything but a list."""
    if not isinstance(payload, list):
        return None
    return [i for i, entry in enumerate(payload) if not (isinstance(entry, Mapping) and _builds_nothing(entry.get("kind")))]


def _builds_nothing(kind: object) -> bool:
    declared = BUILTIN.get(kind) if isinstance(kind, str) else None
    return declared is not None and declared.factory is None


# -- the adapter's side ------------------------------------------------------------------------------


class ReportSender:
    """Sends reports to the inbox at ``path`` (see the module doc); never blocks, never raises."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent = 0
        self.dropped = 0
        self._warned: set[str] = set()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReportSender | None:
        """The sender :data:`SOCKET_ENV` names, or ``None`` when it is unset (logged when it is not an
        absolute path a socket can have)."""
        raw = (os.environ if environ is None else environ).get(SOCKET_ENV, "")
        if not raw:
            return None
        if not os.path.isabs(raw) or len(os.fsencode(raw)) > _SUN_PATH_MAX or "\0" in raw:
            logger.error("%s=%r is not an absolute path a Unix socket can have: failures are not reported to the "
                         "worker", SOCKET_ENV, raw)
            return None
        return cls(raw)

    def send(self, failure: RequestFailure) -> bool:
        """Send one failure report; whether it was queued in the inbox."""
        return self._send(failure.encode(), f"request {failure.request}")

    def progress(self, queued: int, settled: int) -> bool:
        """Send this process's device-check progress."""
        return self._send(Progress(os.getpid(), queued, settled).encode(), "progress")

    def _send(self, data: bytes, what: str) -> bool:
        try:
            self._sock.sendto(data, self.path)
        except OSError as err:  # full (EAGAIN), or the worker and its inbox are gone
            self.dropped += 1
            kind = type(err).__name__
            if kind not in self._warned:
                self._warned.add(kind)
                logger.error("could not report to the worker's inbox %s (%s: %s); dropped (%s); a client may see a "
                             "plain stop for a failed request", self.path, kind, err, what)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._sock.close()


_SENDER: list[ReportSender | None] = []
_SENDER_LOCK = threading.Lock()


def sender() -> ReportSender | None:
    """This process's sender (:meth:`ReportSender.from_env`, made once), or ``None``."""
    if not _SENDER:
        with _SENDER_LOCK:
            if not _SENDER:
                _SENDER.append(ReportSender.from_env())
    return _SENDER[0]


def _reset_sender() -> None:
    _SENDER.clear()


os.register_at_fork(after_in_child=_reset_sender)  # a forked engine process opens its own socket


# -- the worker's side ------------------------------------------------------------------------------


class ReportInbox:
    """The worker's end of the channel: a bound datagram socket in a fresh private directory.

    ``take(id)`` reads what has arrived without waiting and returns (and forgets) the request's
    failure; ``settled(...)`` waits, on the socket's readiness, for device checks to settle. Reports
    for requests nobody takes are kept at most ``capacity`` (oldest dropped); one per request (the
    first: under tensor parallelism every rank reports the same failure)."""

    def __init__(self, *, capacity: int = 1024, receive_buffer: int = 1 << 20) -> None:
        self.capacity = capacity
        self._dir = tempfile.mkdtemp(prefix="dynlogits-failures-")  # mode 0700: only this user enters
        self.path = os.path.join(self._dir, "inbox")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self._sock.bind(self.path)
        except OSError:
            self.close()
            raise
        self._sock.setblocking(False)
        self._failures: OrderedDict[str, RequestFailure] = OrderedDict()
        self._progress: dict[int, Progress] = {}
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._reading: asyncio.AbstractEventLoop | None = None
        #: reports received, and those dropped because ``capacity`` were waiting
        self.received = 0
        self.evicted = 0

    def environ(self) -> dict[str, str]:
        """What the engine's processes need in their environment to report here."""
        return {SOCKET_ENV: self.path}

    def drain(self) -> int:
        """Read every datagram that has arrived (never waits); how many."""
        count = 0
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return count
            except OSError:  # closed
                return count
            count += 1
            record = decode(data)
            if isinstance(record, Progress):  # both counts only grow: keep the highest of each
                seen = self._progress.get(record.pid, record)
                self._progress[record.pid] = Progress(record.pid, max(record.queued, seen.queued),
                                                      max(record.settled, seen.settled))
            elif isinstance(record, RequestFailure) and record.request not in self._failures:
                self.received += 1
                self._failures[record.request] = record
                while len(self._failures) > self.capacity:
                    self._failures.popitem(last=False)
                    self.evicted += 1

    def take(self, request: str) -> RequestFailure | None:
        """The failure reported for ``request`` so far (forgotten here once taken), or ``None``."""
        self.drain()
        return self._failures.pop(request, None)

    def forget(self, request: str) -> None:
        """Drop a report for ``request`` (its stream has ended)."""
        self._failures.pop(request, None)

    def unsettled(self) -> dict[int, int]:
        """Per engine process with device checks in flight, the number it has queued (read now)."""
        self.drain()
        return {pid: p.queued for pid, p in self._progress.items() if p.settled < p.queued}

    async def settled(self, request: str, checks: Mapping[int, int], timeout: float) -> RequestFailure | None:
        """Wait until each process in ``checks`` has settled the checks it had queued (``pid -> queued``)
        or a failure for ``request`` arrives, at most ``timeout`` seconds (logged: only a dropped or lost
        datagram gets there); then the request's failure, or ``None``."""

        def done() -> bool:
            return request in self._failures or all(
                (p := self._progress.get(pid)) is not None and p.settled >= queued for pid, queued in checks.items())

        self.drain()
        if not done():
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            waiter = (done, future)
            self._waiters.append(waiter)
            self._read_on(loop)
            try:
                await asyncio.wait_for(future, timeout)
            except asyncio.TimeoutError:
                logger.warning("the engine's device checks for request %s did not settle within %.1f s; answering it "
                               "as it finished", request, timeout)
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                if not self._waiters:
                    self._stop_reading()
        return self.take(request)

    def _read_on(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._reading is None:
            loop.add_reader(self._sock.fileno(), self._readable)
            self._reading = loop

    def _stop_reading(self) -> None:
        if self._reading is not None:
            with contextlib.suppress(Exception):
                self._reading.remove_reader(self._sock.fileno())
            self._reading = None

    def _readable(self) -> None:
        self.drain()
        for done, future in list(self._waiters):
            if not future.done() and done():
                future.set_result(None)

    def close(self) -> None:
        """Close the socket and remove its directory."""
        self._stop_reading()
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def new_report_id() -> str:
    """A fresh report id (unguessable: another request's id cannot be named by a client)."""
    return secrets.token_urlsafe(12)


def render_paths(detail: str, paths: Sequence[str]) -> str:
    """``detail`` with each ``dynamo_logits[i]`` replaced by ``paths[i]`` (the entry as the client knows it)."""
    return _WIRE_PATH.sub(lambda m: paths[int(m.group(1))] if int(m.group(1)) < len(paths) else m.group(0), detail)
