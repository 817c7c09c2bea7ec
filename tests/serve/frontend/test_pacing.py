"""Per-client pacing of the CPU request bodies cost (``dynlogits.serve.frontend.pacing``): a client
over its burst waits until its debt is paid back at its rate; other clients never wait for it."""

from __future__ import annotations

import pytest

from dynlogits.serve.frontend import pacing
from dynlogits.serve.frontend.args import ServerLimits
from dynlogits.serve.frontend.client_guard import ClientGuard
from dynlogits.serve.frontend.pacing import CostPacer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(pacing.time, "monotonic", c)
    return c


def test_a_client_within_its_burst_never_waits(clock: Clock) -> None:
    pacer = CostPacer(rate_ms_per_s=50, burst_ms=100)
    pacer.charge("a", 60)
    pacer.charge("a", 40)
    assert pacer.wait_s("a") == 0


def test_a_client_over_its_burst_waits_until_its_debt_is_paid_back_at_its_rate(clock: Clock) -> None:
    pacer = CostPacer(rate_ms_per_s=50, burst_ms=100)
    pacer.charge("costly", 300)  # 200 ms over the burst: 4 s at 50 ms/s
    assert pacer.wait_s("costly") == pytest.approx(4.0)
    clock.now += 3
    assert pacer.wait_s("costly") == pytest.approx(1.0)
    clock.now += 1
    assert pacer.wait_s("costly") == 0
    assert pacer.wait_s("normal") == 0  # another client owes nothing


def test_the_pacer_forgets_the_oldest_clients_beyond_its_bound(clock: Clock) -> None:
    pacer = CostPacer(rate_ms_per_s=50, burst_ms=0, max_clients=2)
    for client in ("a", "b", "c"):
        pacer.charge(client, 100)
    assert pacer.wait_s("a") == 0 and pacer.wait_s("b") > 0 and pacer.wait_s("c") > 0


def test_the_guard_paces_with_the_operators_settings() -> None:
    guard = ClientGuard(server=ServerLimits(client_cpu_ms_per_s=20, client_cpu_burst_ms=30))
    assert (guard.pacer.rate_ms_per_s, guard.pacer.burst_ms) == (20, 30)


def test_only_bodies_carrying_logits_entries_or_their_controls_are_charged() -> None:
    assert pacing.carries_entries({"logits_processors": [{"kind": "banned_tokens", "token_ids": [1]}]})
    assert pacing.carries_entries({"logit_bias": {"5": 1}}) and pacing.carries_entries({"bad_words": ["x"]})
    assert not pacing.carries_entries({"messages": [], "stop": ["s"] * 4})
    assert not pacing.carries_entries([1, 2])
