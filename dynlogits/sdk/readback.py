"""Reading small device results back on the host without waiting, and acting on them in bounded time.

A copy to pinned host memory is queued without blocking, with an event;
``INBOX.when_landed(ready, then, device)`` runs ``then()`` once ``ready()`` says it landed, either at
the next ``drain()`` (adapters call it first in every engine call) or on the watcher thread, which
wakes every ``DYN_LOGITS_FAILURE_WATCH_S`` seconds (default 0.05) while something waits, for an
engine gone idle. Neither waits for the device or launches device work. Callbacks run one at a
time, never twice, possibly on the watcher thread. On the CPU ``then()`` runs inside ``when_landed``.

Progress: the copies queued (on a device) and settled (their callbacks run, every older one too) are
counted, and ``Inbox.on_progress(queued, settled)`` is called when a copy is queued (in the engine
call that queues it) and when the settled count grows (after the callbacks that failed requests ran).
A worker answering a request whose failure may still be on its way waits for the checks queued before
its output to settle (``dynlogits.sdk.failure_reports``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["INBOX", "WATCH_ENV", "DeviceFlags", "Inbox", "drain"]

logger = logging.getLogger("dynlogits.sdk")

#: How often (seconds) the watcher thread looks for landed copies while some are waiting.
WATCH_ENV = "DYN_LOGITS_FAILURE_WATCH_S"
DEFAULT_WATCH_S = 0.05


def _watch_period() -> float:
    raw = os.environ.get(WATCH_ENV, "")
    try:
        period = float(raw) if raw else DEFAULT_WATCH_S
    except ValueError:
        period = DEFAULT_WATCH_S
    return period if 0.0 < period <= 60.0 else DEFAULT_WATCH_S


@dataclass(frozen=True)
class _Expected:
    ready: Callable[[], bool]
    then: Callable[[], None]
    device: torch.device
    seq: int = 0  # the order it was queued in (1, 2, ...)


class Inbox:
    """Host callbacks waiting for device copies to land (see the module doc)."""

    def __init__(self, period: float | None = None) -> None:
        self.period = _watch_period() if period is None else period
        #: whether the watcher drains (tests turn it off to see what the adapters' calls do alone)
        self.watching = True
        #: called with (queued, settled) as those counts grow (see the module doc); any thread
        self.on_progress: Callable[[int, int], None] | None = None
        self._reset()

    def _reset(self) -> None:
        self._guard = threading.Condition(threading.Lock())  # ``_waiting`` and the watcher's sleep
        self._draining = threading.Lock()  # one drain at a time: each callback runs once
        self._waiting: list[_Expected] = []
        self._watcher: threading.Thread | None = None
        self.queued = 0  # device copies queued so far
        self.settled = 0  # the highest n such that copies 1..n have all run their callbacks

    def when_landed(self, ready: Callable[[], bool], then: Callable[[], None], device: torch.device) -> None:
        """Run ``then()`` once ``ready()`` is true; at once for a CPU ``device``."""
        if device.type == "cpu":
            then()
            return
        with self._guard:
            self.queued += 1
            queued, settled = self.queued, self.settled
            self._waiting.append(_Expected(ready, then, device, queued))
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="dynlogits-readback", daemon=True)
                self._watcher.start()
            self._guard.notify_all()
        self._progress(queued, settled)

    def _progress(self, queued: int, settled: int) -> None:
        hook = self.on_progress
        if hook is not None:
            try:
                hook(queued, settled)
            except Exception:  # a report must never reach the engine's call
                logger.exception("reporting read-back progress failed")

    def drain(self) -> int:
        """Run the callbacks whose copies have landed, oldest first; how many ran. Never waits for
        the device; returns at once while another thread is draining."""
        return self._drain(in_watcher=False)

    def _drain(self, *, in_watcher: bool) -> int:
        if not self._waiting or not self._draining.acquire(blocking=False):
            return 0
        try:
            with self._guard:
                waiting, self._waiting = self._waiting, []
            landed: list[_Expected] = []
            still: list[_Expected] = []
            for expected in waiting:
                (landed if self._ready(expected, in_watcher) else still).append(expected)
            with self._guard:
                self._waiting[:0] = still
            for expected in landed:
                try:
                    expected.then()
                except Exception:  # a bug here must never reach the engine's call
                    logger.exception("reading a landed device copy failed")
            if landed:
                with self._guard:
                    oldest = min((e.seq for e in self._waiting), default=self.queued + 1)
                    grew = oldest - 1 > self.settled
                    if grew:
                        self.settled = oldest - 1
                    queued, settled = self.queued, self.settled
                if grew:
                    self._progress(queued, settled)
            return len(landed)
        finally:
            self._draining.release()
            with self._guard:
                self._guard.notify_all()

    @staticmethod
    def _ready(expected: _Expected, in_watcher: bool) -> bool:
        if in_watcher and expected.device.type == "cuda":
            with torch.cuda.device(expected.device):  # the watcher queries an event in its device's context
                return expected.ready()
        return expected.ready()

    def waiting(self) -> int:
        """How many callbacks wait for their copy."""
        return len(self._waiting)

    def wait_settled(self, timeout: float) -> bool:
        """Block (a caller's thread, never an adapter's) until nothing waits, at most ``timeout``
        seconds; whether nothing does."""
        with self._guard:
            return self._guard.wait_for(lambda: not self._waiting and not self._draining.locked(), timeout)

    def _watch(self) -> None:
        while True:
            with self._guard:
                self._guard.wait_for(lambda: bool(self._waiting))
                until = time.monotonic() + self.period
                while (left := until - time.monotonic()) > 0:  # a full period, however often notified
                    self._guard.wait(left)
            if self.watching:
                self._drain(in_watcher=True)


INBOX = Inbox()
os.register_at_fork(after_in_child=INBOX._reset)  # a forked engine process starts its own watcher


def drain() -> int:
    """``INBOX.drain()``: what every adapter calls first in every call its engine makes."""
    return INBOX.drain()


class DeviceFlags:
    """A snapshot of a 1-D bool device tensor, readable on the host once the device wrote it."""

    __slots__ = ("_event", "_host", "_values", "device")

    def __init__(self, flags: torch.Tensor) -> None:
        self._values: list[bool] | None = None
        self._event = None
        self.device = flags.device
        if flags.device.type != "cpu":
            self._host = torch.empty(flags.shape, dtype=torch.bool, pin_memory=True)
            self._host.copy_(flags, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = flags.detach().clone()

    def landed(self) -> bool:
        """Whether the copy is on the host. Never blocks."""
        return self._event is None or self._event.query()

    def ready(self) -> list[bool] | None:
        """The flags, or ``None`` while the copy is still in flight. Never blocks."""
        if self._values is None and self.landed():
            self._values = self._host.tolist()
        return self._values
