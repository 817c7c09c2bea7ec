"""Ports for a deployment a tool or test starts: a block free right now, outside the ephemeral range.

A port found free with ``bind(0)`` lies in the kernel's ephemeral range, where any outgoing
connection or another ``bind(0)`` (an engine's own sockets, a readiness poll) can take it between
the check and the deployment binding it. ``free_port_block`` draws below that range instead."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["PORT_FLOOR", "free_port_block"]

#: Where ports are drawn from when the kernel's ephemeral range leaves room below it.
PORT_FLOOR = 10000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out by itself (outgoing connections, ``bind(0)``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _block_free(base: int, n: int) -> bool:
    for p in range(base, base + n):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def free_port_block(n: int) -> int:
    """A port ``p`` such that ``p .. p+n-1`` are free on 127.0.0.1 right now, drawn below the
    kernel's ephemeral range (where none is left there, one ``bind(0)`` finds). Raises
    ``RuntimeError`` after 200 tries."""
    top = _ephemeral_low() - n
    for _ in range(200):
        if top > PORT_FLOOR:
            base = random.randrange(PORT_FLOOR, top)
        else:  # no room below the ephemeral range: take one the kernel finds free
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
            if base + n > 65000:
                continue
        if _block_free(base, n):
            return base
    raise RuntimeError(f"no block of {n} free ports found")
