"""A ``thinking_budget`` request resumed after preemption: short histories are followed on the
device at its first step (every generated token a round of the one fused ``spans_advance_`` a table,
no eager round), long ones scanned once on the host (one read back at that batch change, so the
kernel's loop stays bounded by ``MAX_DEVICE_CATCH_UP``); both reach the host automaton's span."""

from __future__ import annotations

import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.testing.cuda.simcuda import SimCuda

V, PROMPT, SLOTS = 64, 3, 4
START, END = 20, 21


def _resume(generated: list[int], max_catch_up: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str], int]:
    """(span the device tables hold after the first step, the ops of that step, syncs)."""
    monkeypatch.setattr(DeviceThinking, "MAX_DEVICE_CATCH_UP", max_catch_up)
    request = sdk.realize([{"kind": "thinking_budget", "start_token_ids": [START], "end_token_ids": [END],
                            "budget": 10_000}], vocab_size=V, stop_token_id=1)
    assert request is not None
    matrix = torch.zeros(SLOTS, PROMPT + len(generated) + 8, dtype=torch.int32)
    matrix[0, PROMPT : PROMPT + len(generated)] = torch.tensor(generated, dtype=torch.int32)
    with SimCuda() as sim:
        thinking = DeviceThinking(SLOTS + 1, sim.device)
        thinking.assign(0, request, resumed=len(generated))
        thinking.flush()
        tokens = sim.put(matrix)
        prompt_len = sim.put(torch.tensor([PROMPT, 0, 0, 0], dtype=torch.int32))
        total_len = sim.put(torch.tensor([PROMPT + len(generated), 0, 0, 0], dtype=torch.int32))
        before = len(sim.ops)
        thinking.step(tokens, prompt_len, total_len)
        ops = sim.ops[before:]
        span = int(sim.value(next(iter(thinking.tables.values())).span)[0])
    return span, ops, len(sim.syncs)


@pytest.mark.parametrize("length", [12, 400])
def test_a_resumed_thinking_request_reaches_the_host_automatons_span(length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    generated = [7] * length
    generated[length - 5] = START  # a span opened 5 tokens before the end, still open
    scanned, host_ops, host_syncs = _resume(generated, 0, monkeypatch)
    followed, device_ops, device_syncs = _resume(generated, 10**9, monkeypatch)
    assert scanned == followed == length - 4  # the span opened after token length - 5 (positions count from 1)
    assert device_syncs == 0 and host_syncs > 0  # the host scan reads the history back once
    # the whole catch-up is one fused op (its rounds looped in the kernel): no eager round per token
    assert device_ops.count("spans_advance_") == 1 and "addcmul" not in device_ops and len(device_ops) < 10
    assert len(host_ops) < 200


def test_only_long_histories_are_scanned_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    short = [7] * DeviceThinking.MAX_DEVICE_CATCH_UP
    _, _, syncs = _resume(short, DeviceThinking.MAX_DEVICE_CATCH_UP, monkeypatch)
    assert syncs == 0
    _, ops, syncs = _resume(short + [7], DeviceThinking.MAX_DEVICE_CATCH_UP, monkeypatch)
    assert syncs > 0 and len(ops) < 200
