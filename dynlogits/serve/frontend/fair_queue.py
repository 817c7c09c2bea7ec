"""The frontend's fair queue (its 429s): sequences in flight are bounded, each client holds at most
a share of them, and waiting requests are let through round-robin across clients.

:meth:`FairQueue.acquire` returns a :class:`Ticket` for a request's sequences at once when they fit
(even while larger requests wait), else when they fit in turn; the oldest waiter reserves the
capacity once it has waited ``reserve_after_s``. Refusals are :class:`QueueError` (400 or 429) or
:class:`ClientGone`. A client is whatever key the caller names (the frontend: ``.identity``).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClientGone", "FairQueue", "QueueError", "Ticket"]


class QueueError(Exception):
    """A request refused for capacity (HTTP 429, ``retry_after_s`` for the header) or for its own
    size (400). ``reason``: ``client_share``, ``queue_timeout`` or ``too_large``."""

    def __init__(self, status: int, message: str, *, reason: str, param: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.reason, self.param = status, message, reason, param
        self.retry_after_s = retry_after_s


class ClientGone(Exception):
    """The client disconnected while its request waited in the queue."""


@dataclass(eq=False)
class Ticket:
    """``cost`` sequences held for ``client`` until :meth:`release` (idempotent)."""

    client: str
    cost: int
    _release: Callable[[Ticket], None] = field(repr=False)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._release(self)


@dataclass(eq=False)
class _Waiter:
    client: str
    cost: int
    since: float  # loop time it started waiting
    future: asyncio.Future[None]


class FairQueue:
    """The queue of one frontend; use from its event loop only."""

    def __init__(self, *, max_inflight: int, max_per_client: int, queue_timeout_s: float,
                 reserve_after_s: float | None = None) -> None:
        if max_inflight < 1 or max_per_client < 1 or queue_timeout_s <= 0:
            raise ValueError("max_inflight and max_per_client must be >= 1, queue_timeout_s > 0")
        self.max_inflight, self.max_per_client, self.queue_timeout_s = max_inflight, max_per_client, queue_timeout_s
        self.reserve_after_s = queue_timeout_s / 2 if reserve_after_s is None else reserve_after_s
        self.in_flight = 0  # sequences let through and not yet released
        self._held: Counter[str] = Counter()  # per client: in flight + waiting
        self._waiting: OrderedDict[str, deque[_Waiter]] = OrderedDict()  # clients in round-robin order

    @property
    def queued(self) -> int:
        """Requests waiting in the queue."""
        return sum(len(q) for q in self._waiting.values())

    def held(self, client: str) -> int:
        """Sequences ``client`` has in flight or waiting."""
        return self._held[client]

    async def acquire(self, client: str, cost: int, *,
                      disconnected: Callable[[], Awaitable[Any]] | None = None) -> Ticket:
        """A ticket for ``cost`` sequences, at once when they fit (and no request has reserved the
        capacity), else after waiting.

        Raises :class:`QueueError` (400: ``cost`` alone exceeds a client's share; 429: the client's
        share is taken, or the wait exceeded ``queue_timeout_s``), or :class:`ClientGone` when
        ``disconnected()`` returns first (it should return once the client has gone away)."""
        if cost > self.max_per_client:
            raise QueueError(400, f"n: a request of {cost} sequences exceeds what one client may hold "
                                  f"({self.max_per_client}, limit max_client_sequences)", reason="too_large",
                         param="n")
        if self._held[client] + cost > self.max_per_client:
            raise QueueError(429, f"this client already has {self._held[client]} sequences in flight or waiting; "
                                  f"{cost} more would exceed its share of {self.max_per_client} "
                                  "(limit max_client_sequences); retry when some have finished",
                         reason="client_share", retry_after_s=1)
        self._held[client] += cost
        ticket = Ticket(client, cost, self._release)
        loop = asyncio.get_running_loop()
        if self._fits(cost) and self._reserving(loop.time()) is None:
            self.in_flight += cost
            return ticket
        waiter = _Waiter(client, cost, loop.time(), loop.create_future())
        self._waiting.setdefault(client, deque()).append(waiter)
        gone = asyncio.ensure_future(disconnected()) if disconnected is not None else None
        try:
            waits: set[asyncio.Future[Any]] = {waiter.future} | ({gone} if gone is not None else set())
            await asyncio.wait(waits, timeout=self.queue_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while waiting
            self._abandon(waiter, ticket)
            raise
        finally:
            if gone is not None:
                gone.cancel()
        if waiter.future.done():
            return ticket
        self._abandon(waiter, ticket)
        if gone is not None and gone.done() and not gone.cancelled():
            raise ClientGone()
        raise QueueError(429, f"the deployment is at capacity ({self.in_flight} of {self.max_inflight} sequences "
                              f"in flight, limit max_inflight_sequences) and this request waited "
                              f"{self.queue_timeout_s:g} s (limit queue_timeout); retry later",
                         reason="queue_timeout", retry_after_s=1)

    def _fits(self, cost: int) -> bool:
        return self.in_flight + cost <= self.max_inflight

    def _reserving(self, now: float) -> _Waiter | None:
        """The oldest waiting request once it has waited ``reserve_after_s``, else ``None``."""
        oldest = min((q[0] for q in self._waiting.values()), key=lambda w: w.since, default=None)
        return oldest if oldest is not None and now - oldest.since >= self.reserve_after_s else None

    def _abandon(self, waiter: _Waiter, ticket: Ticket) -> None:
        """Undo a wait that ended without the caller taking the ticket (granted meanwhile: release it)."""
        if waiter.future.done():
            ticket.release()
            return
        waiter.future.cancel()
        self._unqueue(waiter)
        ticket.released = True
        self._held[waiter.client] -= ticket.cost
        self._forget(waiter.client)
        self._dispatch()  # a reserving waiter leaving may let others in

    def _release(self, ticket: Ticket) -> None:
        self.in_flight -= ticket.cost
        self._held[ticket.client] -= ticket.cost
        self._forget(ticket.client)
        self._dispatch()

    def _forget(self, client: str) -> None:
        if self._held[client] <= 0:
            del self._held[client]

    def _unqueue(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.client)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[waiter.client]

    def _grant(self, waiter: _Waiter) -> None:
        self._unqueue(waiter)
        if waiter.client in self._waiting:
            self._waiting.move_to_end(waiter.client)  # its next request waits for the other clients' turn
        self.in_flight += waiter.cost
        waiter.future.set_result(None)

    def _dispatch(self) -> None:
        """Let waiting requests through while one fits: the reserving one alone when there is one, else
        round-robin across clients, each client's oldest request that fits."""
        now = asyncio.get_running_loop().time()
        while self._waiting:
            reserving = self._reserving(now)
            if reserving is not None:
                if not self._fits(reserving.cost):
                    return
                self._grant(reserving)
                continue
            fitting = next((w for q in self._waiting.values() for w in q if self._fits(w.cost)), None)
            if fitting is None:
                return
            self._grant(fitting)
