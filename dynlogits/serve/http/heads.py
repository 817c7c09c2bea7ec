"""Bounds on a request's head (request line and headers), checked on the bytes as they arrive.

:class:`HeadScanner` sees a head's raw bytes before uvicorn's parser does and says which of the
:class:`HeadLimits` is exceeded, at most one read's worth of bytes past it (``.connections`` applies
it to every connection of the frontend and the workers). Each limit is read from ``DYN_<NAME>`` and
overridable by the same-named flag; why the parser alone is not enough: ``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..limits import check_positive_fields, env_name, positive_int, positive_int_from_env

__all__ = ["HeadLimits", "HeadProblem", "HeadScanner", "add_head_limit_flags", "head_limits_from_flags"]


@dataclass(frozen=True)
class HeadLimits:
    """Bytes and lines one request head may have; every value is an integer >= 1."""

    #: Bytes of the request line (method, target, version): beyond it, 414.
    max_request_line_bytes: int = 8192
    #: Bytes of one header line (name, value and separators): beyond it, 431.
    max_header_bytes: int = 8192
    #: Header lines: beyond it, 431.
    max_headers: int = 100
    #: Bytes of the whole head, line ends included: beyond it, 431.
    max_head_bytes: int = 32768

    def __post_init__(self) -> None:
        check_positive_fields(self)


@dataclass(frozen=True)
class HeadProblem:
    """A head over a limit: the HTTP ``status`` to answer and a ``message`` naming the limit."""

    status: int
    code: str
    message: str


class HeadScanner:
    """Follows one head at a time through the bytes of a connection.

    :meth:`feed` takes the next bytes of a head and returns the index just past the head's end
    (the blank line) when it is among them, else ``None``; it raises :class:`HeadTooLarge` as soon
    as a limit is exceeded. Lines end with LF (a CR before it counts as part of the line); empty
    lines before the request line are skipped, as HTTP parsers do, but count toward the head's size.
    After a head's end the scanner is ready for the next one.
    """

    def __init__(self, limits: HeadLimits) -> None:
        self.limits = limits
        self.reset()

    def reset(self) -> None:
        self.head_bytes = 0  # the head so far
        self.lines = 0  # complete non-empty lines: the request line, then headers
        self._line = 0  # bytes of the current line so far
        self._cr = False  # the current line's last byte so far is CR

    @property
    def started(self) -> bool:
        return self.head_bytes > 0

    def feed(self, data: bytes) -> int | None:
        limits, pos, size = self.limits, 0, len(data)
        while pos < size:
            newline = data.find(b"\n", pos)
            end = size if newline < 0 else newline
            if end > pos:
                self._line += end - pos
                self._cr = data[end - 1] == 0x0D
            self._check(self.head_bytes + end - pos)
            if newline < 0:
                self.head_bytes += size - pos
                return None
            self.head_bytes += newline + 1 - pos
            pos = newline + 1
            empty = self._line == 0 or (self._line == 1 and self._cr)
            self._line, self._cr = 0, False
            if not empty:
                self.lines += 1
                if self.lines - 1 > limits.max_headers:
                    raise HeadTooLarge(HeadProblem(431, "request_header_fields_too_large",
                                                   f"the request has more than {limits.max_headers} header lines "
                                                   "(limit max_headers)"))
            elif self.lines:  # the blank line ending the head
                self.reset()
                return pos
        return None

    def _check(self, head_bytes: int) -> None:
        limits = self.limits
        if self.lines == 0 and self._line > limits.max_request_line_bytes:
            raise HeadTooLarge(HeadProblem(414, "uri_too_long",
                                           f"the request line exceeds {limits.max_request_line_bytes} bytes "
                                           "(limit max_request_line_bytes)"))
        if self.lines > 0 and self._line > limits.max_header_bytes:
            raise HeadTooLarge(HeadProblem(431, "request_header_fields_too_large",
                                           f"a header line exceeds {limits.max_header_bytes} bytes "
                                           "(limit max_header_bytes)"))
        if head_bytes > limits.max_head_bytes:
            raise HeadTooLarge(HeadProblem(431, "request_header_fields_too_large",
                                           f"the request head exceeds {limits.max_head_bytes} bytes "
                                           "(limit max_head_bytes)"))


class HeadTooLarge(Exception):
    """Raised by :meth:`HeadScanner.feed` with the :class:`HeadProblem`."""

    def __init__(self, problem: HeadProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def add_head_limit_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    """Add ``--max-request-line-bytes`` ... to ``parser``, defaulting to ``$DYN_<NAME>``; a bad
    variable is a usage error naming it."""
    group = parser.add_argument_group("request head limits (default: $DYN_<NAME>, else the built-in value)")
    defaults = HeadLimits()
    for f in fields(HeadLimits):
        try:
            default = positive_int_from_env(environ, f.name, getattr(defaults, f.name))
        except ValueError as err:
            parser.error(str(err))
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=positive_int, default=default, metavar="N",
                           help=f"(${env_name(f.name)}, default {default})")


def head_limits_from_flags(ns: argparse.Namespace) -> HeadLimits:
    return HeadLimits(**{f.name: getattr(ns, f.name) for f in fields(HeadLimits)})
