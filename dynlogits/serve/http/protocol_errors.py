"""Client protocol errors (a malformed head or chunked body, a head over its limits, an unsupported
upgrade, a body cut short): counted by kind, logged at most once per interval per kind, no traceback.

:class:`ProtocolErrorLog` keeps every occurrence in its counts and writes one line per kind per
``interval_s`` saying how many it left unlogged; :data:`UVICORN_FILTER` drops uvicorn's own warning
lines for the same errors.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Final

__all__ = ["DEFAULT_LOG_INTERVAL_S", "KINDS", "ProtocolErrorLog", "UVICORN_FILTER", "install_uvicorn_filter"]

#: Seconds between two log lines of one kind.
DEFAULT_LOG_INTERVAL_S: Final = 60.0

#: Every kind a server reports, with what it means (the ``kind`` label of the metric).
KINDS: Final = {
    "invalid_http": "a request the HTTP parser refused (malformed request line, headers or chunked body)",
    "head_too_large": "a request head over its limits (414 or 431)",
    "unsupported_upgrade": "a request asking to upgrade the connection (e.g. to WebSocket)",
    "body_incomplete": "a connection that ended before its request's body had arrived",
}


class ProtocolErrorLog:
    """Counts and rate-limited log lines for client protocol errors (use from one event loop)."""

    def __init__(self, log: logging.Logger, *, interval_s: float = DEFAULT_LOG_INTERVAL_S,
                 on_error: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.interval_s, self.on_error, self._clock = log, interval_s, on_error, clock
        self.counts: Counter[str] = Counter()
        self._last_logged: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def report(self, kind: str, detail: str = "") -> None:
        """Count one error of ``kind``; log it unless a line of that kind was written in the last
        ``interval_s`` (then it is counted in the next line's "more" figure)."""
        self.counts[kind] += 1
        if self.on_error is not None:
            self.on_error(kind)
        now = self._clock()
        last = self._last_logged.get(kind)
        if last is not None and now - last < self.interval_s:
            self._unlogged[kind] += 1
            return
        self._last_logged[kind] = now
        more = self._unlogged.pop(kind, 0)
        self.log.warning("client protocol error (%s)%s%s", kind, f": {detail}" if detail else "",
                         f"; {more} more of this kind since the last such line (one line per {self.interval_s:g} s)"
                         if more else "")


class _UvicornFilter(logging.Filter):
    """Drops uvicorn's per-request warnings for client protocol errors."""

    DROPPED = ("Invalid HTTP request received.", "Unsupported upgrade request.",
               "No supported WebSocket library detected")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.DROPPED))


UVICORN_FILTER: Final = _UvicornFilter()


def install_uvicorn_filter() -> None:
    """Add :data:`UVICORN_FILTER` to uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if UVICORN_FILTER not in logger.filters:
        logger.addFilter(UVICORN_FILTER)
