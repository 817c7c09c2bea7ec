"""Client protocol errors are counted one by one and logged at most once per interval per kind, with
the number left unlogged (``dynlogits.serve.http.protocol_errors``); uvicorn's own line for each is dropped."""

from __future__ import annotations

import logging

import pytest

from dynlogits.serve.http.protocol_errors import UVICORN_FILTER, ProtocolErrorLog, install_uvicorn_filter


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_kind_per_interval_every_error_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock, seen = _Clock(), []
    errors = ProtocolErrorLog(logging.getLogger("test.pe"), interval_s=60, on_error=seen.append, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.pe"):
        for _ in range(200):
            errors.report("invalid_http", "Invalid HTTP request received. (client 10.0.0.1)")
        errors.report("head_too_large", "the request head exceeds 32768 bytes")
        clock.now += 59.9
        errors.report("invalid_http")
        clock.now += 0.2
        errors.report("invalid_http", "again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["client protocol error (invalid_http): Invalid HTTP request received. (client 10.0.0.1)",
                     "client protocol error (head_too_large): the request head exceeds 32768 bytes",
                     "client protocol error (invalid_http): again; 200 more of this kind since the last such line "
                     "(one line per 60 s)"]
    assert all(r.exc_info is None for r in caplog.records)  # never a traceback
    assert errors.counts == {"invalid_http": 202, "head_too_large": 1} and len(seen) == 203


def test_uvicorns_per_request_warnings_are_dropped_others_kept() -> None:
    install_uvicorn_filter()
    install_uvicorn_filter()
    logger = logging.getLogger("uvicorn.error")
    assert logger.filters.count(UVICORN_FILTER) == 1

    def record(msg: str) -> logging.LogRecord:
        return logger.makeRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, (), None)

    assert not UVICORN_FILTER.filter(record("Invalid HTTP request received."))
    assert not UVICORN_FILTER.filter(record("Unsupported upgrade request."))
    assert UVICORN_FILTER.filter(record("Exception in ASGI application\n"))
