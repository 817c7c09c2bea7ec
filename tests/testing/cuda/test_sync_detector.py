"""The CUDA model (``dynlogits.testing.cuda.simcuda``) reports every kind of host-device synchronization at
the dispatch level, and a sync injected into either apply path makes the adapter's sequence fail
the no-sync rule (mutation tests: each kind injected in turn must be reported)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from dynlogits.testing.cuda.drive import Scenario, drive_apply_rows, drive_v1
from dynlogits.testing.cuda.simcuda import SimCuda

Inject = Callable[[torch.Tensor], object]

#: One of each sync kind the issue names, applied to a device tensor (the step's logits).
INJECTIONS: dict[str, Inject] = {
    "item": lambda t: t[0, 0].item(),
    "tolist": lambda t: t[0].tolist(),
    "bool": lambda t: bool(t[0, 0] > 0),
    "int": lambda t: int(t[0, 0]),
    "nonzero": lambda t: t.nonzero(),
    "mask index": lambda t: t[t > 0],
    "masked_select": lambda t: t.masked_select(t > 0),
    "unique": lambda t: torch.unique(t),
    "repeat_interleave": lambda t: torch.repeat_interleave(torch.ones(2, dtype=torch.long, device=t.device),
                                                           torch.ones(2, dtype=torch.long, device=t.device)),
    "pageable copy": lambda t: torch.arange(3).to(t.device),
    "tensor from a list": lambda t: torch.tensor([1, 2], device=t.device),
    "one-argument where": lambda t: torch.where(t > 0),
    "cpu": lambda t: t.cpu(),
    "host index operand": lambda t: t[torch.tensor([0])],
    "device synchronize": lambda t: torch.cuda.synchronize(),
    "blocking to(cpu)": lambda t: t.to("cpu"),
    "a number into one element": lambda t: t.__setitem__((0, 0), 0.0),  # seen syncing on an H200
}


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_each_sync_kind_on_a_device_tensor_is_reported(name: str) -> None:
    with SimCuda() as sim:
        t = sim.put(torch.randn(4, 8))
        INJECTIONS[name](t)
    assert sim.syncs, f"{name} was not reported"


def test_device_only_work_and_pinned_non_blocking_copies_are_not_syncs() -> None:
    with SimCuda() as sim:
        t = sim.put(torch.randn(4, 8))
        idx = torch.zeros(3, dtype=torch.long, device=sim.device)
        t.view(-1).index_fill_(0, idx, float("-inf"))
        t[1:3].fill_(0.0)
        torch.isneginf(t).all(1)
        host = torch.zeros(3, dtype=torch.long, pin_memory=True)
        idx.copy_(host, non_blocking=True)
        back = torch.zeros(4, 8, pin_memory=True)
        back.copy_(t, non_blocking=True)
    assert sim.syncs == []
    assert sim.launches == 7  # zeros, index_fill_, fill_, isneginf, all, and both copies (views queue nothing)


def test_a_number_into_several_elements_is_a_fill_not_a_sync() -> None:
    """Only a single element gets the blocking copy (the H200 showed it); a row or a slice is a fill."""
    with SimCuda() as sim:
        t = sim.put(torch.randn(4, 8))
        t[3] = 1.0
        t[..., 2] = 0.0
        t[0, 1:2] = 0.0
    assert sim.syncs == []


def test_a_non_blocking_copy_lands_only_once_the_device_caught_up() -> None:
    """The stream model: reading a pinned buffer before its event completed shows the old value."""
    with SimCuda() as sim:
        t = sim.put(torch.ones(3))
        back = torch.zeros(3, pin_memory=True)
        back.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        assert not event.query() and back.tolist() == [0.0, 0.0, 0.0]
        sim.advance()
        assert event.query() and back.tolist() == [1.0, 1.0, 1.0]
    assert sim.syncs == []


def _inject_into(monkeypatch: pytest.MonkeyPatch, target: object, method: str, inject: Inject,
                 logits_of: Callable[..., torch.Tensor]) -> None:
    real = getattr(target, method)

    def patched(*args: object, **kwargs: object) -> object:
        inject(logits_of(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, method, patched)


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_a_sync_injected_into_the_resident_path_fails_the_no_sync_rule(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynlogits.processors import banned_tokens

    _inject_into(monkeypatch, banned_tokens.BannedTokensGroup, "apply_listed", INJECTIONS[name], lambda self, step, rows: step.logits)
    with SimCuda() as sim:
        result = drive_v1(sim, Scenario(steps=5))
    injected = [s for s in result.syncs if "test_sync_detector" in s.where]
    assert injected, f"{name} injected into BannedTokensGroup.apply_listed was not reported: {result.syncs}"


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_a_sync_injected_into_the_hosted_path_fails_the_no_sync_rule(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynlogits import sdk
    from dynlogits.processors import ops

    _inject_into(monkeypatch, ops, "_mask", INJECTIONS[name], lambda logits, items: logits)
    monkeypatch.setitem(ops.BATCHED, ops.MaskIds, ops._mask)

    def entry() -> Callable[..., list[str]]:
        realized: dict[int, sdk.GuardedRequest | None] = {}

        def call(logits: torch.Tensor, rows: list[int], payloads: list, histories: list) -> list[str]:
            requests = [realized.setdefault(id(p), sdk.realize(p, vocab_size=logits.shape[-1], stop_token_id=1))
                        for p in payloads]
            sdk.apply_rows(logits, rows, requests, histories)  # type: ignore[arg-type]
            return []

        return call

    with SimCuda() as sim:
        result = drive_apply_rows(sim, Scenario(steps=4), entry)
    injected = [s for s in result.syncs if "test_sync_detector" in s.where]
    assert injected, f"{name} injected into the hosted path's mask op was not reported"


def test_a_non_blocking_copy_to_the_host_is_no_sync_and_fills_in_later() -> None:
    with SimCuda() as sim:
        host = sim.put(torch.ones(3)).to("cpu", non_blocking=True)
        assert host.tolist() == [0.0, 0.0, 0.0]
        event = torch.cuda.Event()
        event.record()
        sim.advance()
        assert event.query() and host.tolist() == [1.0, 1.0, 1.0]
    assert sim.syncs == []


def test_numpy_on_a_device_tensor_is_a_sync() -> None:
    with SimCuda() as sim:
        np.asarray(sim.put(torch.ones(2)).numpy())
    assert [s.kind for s in sim.syncs] == ["d2h copy"]


def test_many_uploads_in_one_step_grow_the_ring_instead_of_waiting() -> None:
    """A row-wise engine calls the SDK once per request: hundreds of small uploads in one step
    while the device has not caught up must not wait for it."""
    from dynlogits.processors.uploads import to_device

    with SimCuda() as sim:
        outs = [to_device([i, i + 1], torch.long, sim.device) for i in range(300)]
        assert sim.syncs == []
        sim.advance()
        assert sim.value(outs[299]).tolist() == [299, 300]
