"""``free_port_block``: a block of ports free now, below the kernel's ephemeral range where there is room."""

from __future__ import annotations

import socket

import pytest

from dynlogits.tools import ports


def _bind_all(base: int, n: int) -> None:
    socks = [socket.socket() for _ in range(n)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))  # raises if the block is not free
    finally:
        for s in socks:
            s.close()


def test_a_block_is_drawn_below_the_ephemeral_range_and_is_bindable() -> None:
    low = ports._ephemeral_low()
    for n in (1, 3):
        base = ports.free_port_block(n)
        if low - n > ports.PORT_FLOOR:
            assert ports.PORT_FLOOR <= base and base + n <= low
        _bind_all(base, n)


def test_a_port_in_use_is_never_part_of_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        free = ports.free_port_block(2)
        picks = iter([port - 1, free])  # the first block would hold the port in use
        monkeypatch.setattr(ports.random, "randrange", lambda lo, hi: next(picks))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65000)
        monkeypatch.setattr(ports, "PORT_FLOOR", 1024)
        assert ports.free_port_block(2) == free


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports.PORT_FLOOR)
    base = ports.free_port_block(2)
    _bind_all(base, 2)


def test_no_free_block_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_block_free", lambda base, n: False)
    with pytest.raises(RuntimeError, match="no block of 2 free ports"):
        ports.free_port_block(2)
