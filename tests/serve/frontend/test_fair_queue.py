"""The fair queue (``dynlogits.serve.frontend.fair_queue``): a client's share is bounded, capacity that
frees goes round-robin to the clients waiting, a small request is not queued behind larger ones it
fits beside (unless one has waited long enough to reserve the capacity), and nothing leaks when a
wait ends any other way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dynlogits.serve.frontend.fair_queue import ClientGone, FairQueue, QueueError, Ticket


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 30))


def test_a_client_over_its_share_is_refused_at_once_while_others_get_through() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=128, max_per_client=32, queue_timeout_s=30)
        held = [await q.acquire("abuser", 16), await q.acquire("abuser", 16)]
        with pytest.raises(QueueError) as err:
            await q.acquire("abuser", 1)
        assert err.value.status == 429 and "max_client_sequences" in err.value.message
        normal = await q.acquire("normal", 1)  # no wait: the abuser's share leaves room
        assert q.in_flight == 33 and q.queued == 0
        held[0].release()
        await q.acquire("abuser", 16)  # room again in its own share
        normal.release()

    run(test)


def test_a_request_larger_than_any_share_is_a_400_naming_n() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=16, max_per_client=8, queue_timeout_s=30)
        with pytest.raises(QueueError) as err:
            await q.acquire("c", 9)
        assert err.value.status == 400 and err.value.param == "n"

    run(test)


def test_freed_capacity_goes_round_robin_to_waiting_clients() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=2, max_per_client=3, queue_timeout_s=30)
        running = [await q.acquire("x", 1), await q.acquire("y", 1)]
        order: list[str] = []

        async def wait(client: str) -> Ticket:
            ticket = await q.acquire(client, 1)
            order.append(client)
            return ticket

        # x queues two requests before y and z queue one each: they are served x, y, z, x
        tasks = [asyncio.create_task(wait(c)) for c in ("x", "x", "y", "z")]
        await _until(lambda: q.queued == 4)
        for served in range(1, 5):
            running.pop(0).release()
            await _until(lambda served=served: len(order) == served)
            running.append(next(t.result() for t in tasks if t.done() and t.result() not in running
                                and not t.result().released))
        assert order == ["x", "y", "z", "x"]
        for ticket in running:
            ticket.release()
        assert q.in_flight == 0 and q.held("x") == q.held("y") == q.held("z") == 0

    run(test)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0)


def test_a_wait_past_the_queue_timeout_is_a_429_and_frees_its_place() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=1, max_per_client=1, queue_timeout_s=0.2)
        held = await q.acquire("x", 1)
        with pytest.raises(QueueError) as err:
            await q.acquire("y", 1)
        assert err.value.status == 429 and "queue_timeout" in err.value.message
        assert q.queued == 0 and q.held("y") == 0
        held.release()
        (await q.acquire("y", 1)).release()
        assert q.in_flight == 0

    run(test)


def test_a_client_that_leaves_while_waiting_is_dropped_without_running() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=1, max_per_client=1, queue_timeout_s=30)
        held = await q.acquire("x", 1)
        left = asyncio.Event()
        waiting = asyncio.create_task(q.acquire("y", 1, disconnected=left.wait))
        await _until(lambda: q.queued == 1)
        left.set()
        with pytest.raises(ClientGone):
            await waiting
        assert q.queued == 0 and q.held("y") == 0
        held.release()
        assert q.in_flight == 0

    run(test)


def test_a_cancelled_wait_and_a_double_release_leak_nothing() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=1, max_per_client=1, queue_timeout_s=30)
        held = await q.acquire("x", 1)
        waiting = asyncio.create_task(q.acquire("y", 1))
        await _until(lambda: q.queued == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        held.release()
        held.release()
        assert q.in_flight == 0 and q.queued == 0 and q.held("x") == q.held("y") == 0

    run(test)


def test_a_small_request_gets_through_beside_larger_ones_waiting() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=32, max_per_client=32, queue_timeout_s=30)
        big, other = await q.acquire("abuser", 16), await q.acquire("other", 8)  # 24 of 32 in flight
        large = asyncio.create_task(q.acquire("abuser2", 16))  # 40 > 32: waits
        await _until(lambda: q.queued == 1)
        small = await asyncio.wait_for(q.acquire("normal", 1), 5)  # 25 <= 32: through at once
        assert q.in_flight == 25 and q.queued == 1
        big.release()  # 9 in flight: the waiting 16 fits
        ticket = await asyncio.wait_for(large, 5)
        assert q.in_flight == 25 and q.queued == 0
        for t in (other, small, ticket):
            t.release()
        assert q.in_flight == 0 and not q.held("abuser2")

    run(test)


def test_capacity_freed_goes_to_a_waiting_request_that_fits_not_only_the_first() -> None:
    async def test() -> None:
        q = FairQueue(max_inflight=4, max_per_client=4, queue_timeout_s=30)
        held = [await q.acquire("x", 2), await q.acquire("y", 2)]
        large = asyncio.create_task(q.acquire("big", 4))
        small = asyncio.create_task(q.acquire("small", 1))
        await _until(lambda: q.queued == 2)  # nothing fits while 4 are in flight
        held[0].release()  # 2 free: the 4 still does not fit, the 1 does
        await asyncio.wait_for(small, 5)
        assert not large.done() and q.in_flight == 3
        small.result().release()
        held[1].release()
        (await asyncio.wait_for(large, 5)).release()
        assert q.in_flight == 0

    run(test)


def test_a_request_waiting_past_reserve_after_holds_the_capacity_for_itself() -> None:
    """With ``reserve_after_s=0`` a waiting request reserves at once: a smaller one that would fit
    waits behind it, so a large request is not overtaken for ever."""
    async def test() -> None:
        q = FairQueue(max_inflight=4, max_per_client=4, queue_timeout_s=30, reserve_after_s=0)
        assert FairQueue(max_inflight=4, max_per_client=4, queue_timeout_s=30).reserve_after_s == 15
        held = await q.acquire("x", 3)
        large = asyncio.create_task(q.acquire("big", 4))
        await _until(lambda: q.queued == 1)
        small = asyncio.create_task(q.acquire("small", 1))  # fits (4 <= 4) but the large one reserves
        await _until(lambda: q.queued == 2)
        held.release()
        (await asyncio.wait_for(large, 5)).release()
        (await asyncio.wait_for(small, 5)).release()
        assert q.in_flight == 0 and q.queued == 0

    run(test)
