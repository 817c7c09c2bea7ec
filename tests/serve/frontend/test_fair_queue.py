"""Fair admission (``dynlogits.serve.frontend.fair_queue``): a client's share is bounded, capacity that
frees goes round-robin to the clients waiting, a small request is not queued behind larger ones it
fits beside (unless one has waited long enough to reserve the capacity), and nothing leaks when a
wait ends any other way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dynlogits.serve.frontend.fair_queue import Admission, AdmissionError, ClientGone, Ticket


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


def test_a_small_request_is_admitted_beside_larger_ones_waiting() -> None:
    async def test() -> None:
        a = Admission(max_inflight=32, max_per_client=32, queue_timeout_s=30)
        big, other = await a.admit("abuser", 16), await a.admit("other", 8)  # 24 of 32 in flight
        large = asyncio.create_task(a.admit("abuser2", 16))  # 40 > 32: waits
        await _until(lambda: a.queued == 1)
        small = await asyncio.wait_for(a.admit("normal", 1), 5)  # 25 <= 32: admitted at once
        assert a.in_flight == 25 and a.queued == 1
        big.release()  # 9 in flight: the waiting 16 fits
        ticket = await asyncio.wait_for(large, 5)
        assert a.in_flight == 25 and a.queued == 0
        for t in (other, small, ticket):
            t.release()
        assert a.in_flight == 0 and not a.held("abuser2")

    run(test)


def test_capacity_freed_goes_to_a_waiting_request_that_fits_not_only_the_first() -> None:
    async def test() -> None:
        a = Admission(max_inflight=4, max_per_client=4, queue_timeout_s=30)
        held = [await a.admit("x", 2), await a.admit("y", 2)]
        large = asyncio.create_task(a.admit("big", 4))
        small = asyncio.create_task(a.admit("small", 1))
        await _until(lambda: a.queued == 2)  # nothing fits while 4 are in flight
        held[0].release()  # 2 free: the 4 still does not fit, the 1 does
        await asyncio.wait_for(small, 5)
        assert not large.done() and a.in_flight == 3
        small.result().release()
        held[1].release()
        (await asyncio.wait_for(large, 5)).release()
        assert a.in_flight == 0

    run(test)


def test_a_request_waiting_past_reserve_after_holds_the_capacity_for_itself() -> None:
    """With ``reserve_after_s=0`` a waiting request reserves at once: a smaller one that would fit
    waits behind it, so a large request is not overtaken for ever."""
    async def test() -> None:
        a = Admission(max_inflight=4, max_per_client=4, queue_timeout_s=30, reserve_after_s=0)
        assert Admission(max_inflight=4, max_per_client=4, queue_timeout_s=30).reserve_after_s == 15
        held = await a.admit("x", 3)
        large = asyncio.create_task(a.admit("big", 4))
        await _until(lambda: a.queued == 1)
        small = asyncio.create_task(a.admit("small", 1))  # fits (4 <= 4) but the large one reserves
        await _until(lambda: a.queued == 2)
        held.release()
        (await asyncio.wait_for(large, 5)).release()
        (await asyncio.wait_for(small, 5)).release()
        assert a.in_flight == 0 and a.queued == 0

    run(test)
