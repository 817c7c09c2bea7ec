"""Sending the planned requests with the ``openai`` client, and judging each answer.

:func:`run_load` keeps ``concurrency`` requests in flight until every plan was sent; each yields
one :class:`Answer` (what came back) and :func:`judge` turns the answers into :class:`Verdict`\\ s.
The client never retries (``max_retries=0``): a retry would hide a lost request or duplicate one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .plan import Plan

__all__ = ["Answer", "Status", "Verdict", "judge", "run_load"]

Status = Literal["ok", "cross_talk", "wrong_output", "lost", "duplicated", "error"]


@dataclass
class Answer:
    """What one request got back. ``finished`` counts choices that reported a finish reason
    (more than one for a single choice means a duplicated ending); ``ids`` are the response ids seen."""

    plan: Plan
    text: str = ""
    finished: int = 0
    ids: set[str] = field(default_factory=set)
    completion_tokens: int = 0
    latency_ms: float = 0.0
    error: str | None = None
    #: the HTTP status of an error answer (``None``: no answer, or no error)
    status: int | None = None


@dataclass(frozen=True)
class Verdict:
    plan: Plan
    status: Status
    detail: str = ""


async def _send(client: Any, plan: Plan, model: str, timeout_s: float) -> Answer:
    answer = Answer(plan)
    kwargs = plan.request(model)
    create = client.chat.completions.create if plan.endpoint == "chat" else client.completions.create
    parts: list[str] = []

    async def receive() -> None:
        if plan.stream:
            stream = await create(**kwargs)
            async for chunk in stream:
                answer.ids.add(chunk.id)
                if chunk.usage is not None:
                    answer.completion_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    parts.append((choice.delta.content if plan.endpoint == "chat" else choice.text) or "")
                    answer.finished += choice.finish_reason is not None
        else:
            reply = await create(**kwargs)
            answer.ids.add(reply.id)
            answer.completion_tokens = reply.usage.completion_tokens if reply.usage else 0
            for choice in reply.choices:
                parts.append((choice.message.content if plan.endpoint == "chat" else choice.text) or "")
                answer.finished += choice.finish_reason is not None

    started = time.perf_counter()
    try:
        await asyncio.wait_for(receive(), timeout_s)
    except asyncio.TimeoutError:
        answer.error = f"no answer within {timeout_s:g} s"
    except Exception as err:  # noqa: BLE001 - every failure is counted, none stops the run
        answer.error = f"{type(err).__name__}: {getattr(err, 'message', None) or err}"
        answer.status = getattr(err, "status_code", None)
    answer.latency_ms = (time.perf_counter() - started) * 1000
    answer.text = "".join(parts)
    return answer


async def run_load(client: Any, plans: Sequence[Plan], *, model: str, concurrency: int, timeout_s: float,
                   progress: Callable[[int, int], None] | None = None) -> list[Answer]:
    """Send every plan, at most ``concurrency`` at a time; answers in plan order.

    ``progress(done, failed)`` is called after each answer. A request still unanswered
    ``timeout_s`` after it was sent ends as an error, so a hung server cannot hang the run.
    """
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(plans)):
        queue.put_nowait(i)
    answers: list[Answer | None] = [None] * len(plans)
    failed = 0

    async def client_loop() -> None:
        nonlocal failed
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            answer = await _send(client, plans[i], model, timeout_s)
            answers[i] = answer
            failed += answer.error is not None
            if progress is not None:
                progress(sum(a is not None for a in answers), failed)

    await asyncio.gather(*(client_loop() for _ in range(min(concurrency, len(plans)))))
    return [a if a is not None else Answer(p, error="never sent") for a, p in zip(answers, plans, strict=True)]


def judge(answers: Sequence[Answer]) -> list[Verdict]:
    """One verdict per answer, the first rule that applies:

    ``error`` (the request failed) · ``lost`` (it ended without a finished choice) · ``duplicated``
    (a choice finished twice, or its response id also answered another request) · ``cross_talk``
    (a forced answer that is not exactly its own text, or any answer carrying another request's
    forced text) · ``wrong_output`` (a bias/banned answer other than its predictable text) · ``ok``.
    """
    id_count = Counter(i for a in answers for i in a.ids)
    forced = {a.plan.forced_text: a.plan.index for a in answers if a.plan.forced_text is not None}
    verdicts: list[Verdict] = []
    for a in answers:
        plan = a.plan
        if a.error is not None:
            verdicts.append(Verdict(plan, "error", a.error))
        elif a.finished == 0:
            verdicts.append(Verdict(plan, "lost", f"no finished choice (text so far {a.text!r})"))
        elif a.finished > 1 or any(id_count[i] > 1 for i in a.ids):
            verdicts.append(Verdict(plan, "duplicated", f"{a.finished} finished choices, ids {sorted(a.ids)}"))
        elif plan.kind == "forced" and a.text != plan.expected:
            verdicts.append(Verdict(plan, "cross_talk", f"expected {plan.expected!r}, got {a.text!r}"))
        elif plan.kind != "forced" and forced.get(a.text) is not None:
            verdicts.append(Verdict(plan, "cross_talk", f"got request {forced[a.text]}'s forced text {a.text!r}"))
        elif plan.expected is not None and a.text != plan.expected:
            verdicts.append(Verdict(plan, "wrong_output", f"expected {plan.expected!r}, got {a.text!r}"))
        else:
            verdicts.append(Verdict(plan, "ok"))
    return verdicts


def print_progress(total: int, every_s: float = 5.0) -> Callable[[int, int], None]:
    """A ``progress`` callback printing ``done/total`` to stderr at most every ``every_s`` seconds."""
    last = [time.monotonic()]

    def report(done: int, failed: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= every_s:
            last[0] = now
            print(f"[load] {done}/{total} answered, {failed} failed", file=sys.stderr, flush=True)

    return report
