"""Fair admission (``dynlogits.frontend.admission``): a client's share is bounded, capacity that
frees goes round-robin to the clients waiting, and nothing leaks when a wait ends any other way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dynlogits.frontend.admission import Admission, AdmissionError, ClientGone, Ticket, client_key


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 30))


def test_a_client_over_its_share_is_refused_at_once_while_others_are_admitted() -> None:
    async def test() -> None:
        a = Admission(max_inflight=128, max_per_client=32, queue_timeout_s=30)
        held = [await a.admit("abuser", 16), await a.admit("abuser", 16)]
        with pytest.raises(AdmissionError) as err:
            await a.admit("abuser", 1)
        assert err.value.status == 429 and "max_client_sequences" in err.value.message
        normal = await a.admit("normal", 1)  # no wait: the abuser's share leaves room
        assert a.in_flight == 33 and a.queued == 0
        held[0].release()
        await a.admit("abuser", 16)  # room again in its own share
        normal.release()

    run(test)


def test_a_request_larger_than_any_share_is_a_400_naming_n() -> None:
    async def test() -> None:
        a = Admission(max_inflight=16, max_per_client=8, queue_timeout_s=30)
        with pytest.raises(AdmissionError) as err:
            await a.admit("c", 9)
        assert err.value.status == 400 and err.value.param == "n"

    run(test)


def test_freed_capacity_goes_round_robin_to_waiting_clients() -> None:
    async def test() -> None:
        a = Admission(max_inflight=2, max_per_client=3, queue_timeout_s=30)
        running = [await a.admit("x", 1), await a.admit("y", 1)]
        order: list[str] = []

        async def wait(client: str) -> Ticket:
            ticket = await a.admit(client, 1)
            order.append(client)
            return ticket

        # x queues two requests before y and z queue one each: they are served x, y, z, x
        tasks = [asyncio.create_task(wait(c)) for c in ("x", "x", "y", "z")]
        await _until(lambda: a.queued == 4)
        for served in range(1, 5):
            running.pop(0).release()
            await _until(lambda: len(order) == served)
            running.append(next(t.result() for t in tasks if t.done() and t.result() not in running
                                and not t.result().released))
        assert order == ["x", "y", "z", "x"]
        for ticket in running:
            ticket.release()
        assert a.in_flight == 0 and a.held("x") == a.held("y") == a.held("z") == 0

    run(test)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)


def test_a_wait_past_the_queue_timeout_is_a_429_and_frees_its_place() -> None:
    async def test() -> None:
        a = Admission(max_inflight=1, max_per_client=1, queue_timeout_s=0.2)
        held = await a.admit("x", 1)
        with pytest.raises(AdmissionError) as err:
            await a.admit("y", 1)
        assert err.value.status == 429 and "queue_timeout" in err.value.message
        assert a.queued == 0 and a.held("y") == 0
        held.release()
        (await a.admit("y", 1)).release()
        assert a.in_flight == 0

    run(test)


def test_a_client_that_leaves_while_waiting_is_dropped_without_running() -> None:
    async def test() -> None:
        a = Admission(max_inflight=1, max_per_client=1, queue_timeout_s=30)
        held = await a.admit("x", 1)
        left = asyncio.Event()
        waiting = asyncio.create_task(a.admit("y", 1, disconnected=left.wait))
        await _until(lambda: a.queued == 1)
        left.set()
        with pytest.raises(ClientGone):
            await waiting
        assert a.queued == 0 and a.held("y") == 0
        held.release()
        assert a.in_flight == 0

    run(test)


def test_a_cancelled_wait_and_a_double_release_leak_nothing() -> None:
    async def test() -> None:
        a = Admission(max_inflight=1, max_per_client=1, queue_timeout_s=30)
        held = await a.admit("x", 1)
        waiting = asyncio.create_task(a.admit("y", 1))
        await _until(lambda: a.queued == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        held.release()
        held.release()
        assert a.in_flight == 0 and a.queued == 0 and a.held("x") == a.held("y") == 0

    run(test)


def test_a_client_is_its_peer_address_unless_a_header_names_it() -> None:
    scope = {"client": ("10.0.0.7", 5555), "headers": [(b"authorization", b"Bearer k1")]}
    assert client_key(scope, None) == "peer:10.0.0.7"
    assert client_key(scope, "Authorization") == "Authorization:Bearer k1"
    assert client_key({**scope, "headers": []}, "authorization") == "peer:10.0.0.7"
