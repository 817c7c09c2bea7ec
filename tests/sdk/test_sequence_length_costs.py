"""A step costs the same at any sequence length: nothing re-reads whole histories per step, on the
host path (``thinking_budget``'s automaton, rejected drafts included) or the resident path."""

from __future__ import annotations

import numpy as np
import torch
from torch_counting import OpCounter

from dynlogits import sdk
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.thinking_budget import ROLLBACK, ThinkingBudgetProcessor
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 64
EOS = 1


class CountingHistory(list):
    """A history that counts how many tokens are read from it."""

    reads = 0

    def __getitem__(self, index):  # noqa: ANN001, ANN204
        got = super().__getitem__(index)
        CountingHistory.reads += len(got) if isinstance(index, slice) else 1
        return got


def test_thinking_budget_reads_a_bounded_window_per_step_even_when_drafts_are_rejected() -> None:
    processor = ThinkingBudgetProcessor([30], [31, 32], budget=10_000)
    history = CountingHistory([5] * 20_000 + [30])
    processor.row_op(history)  # the first call scans everything once
    worst = 0
    for step in range(50):
        if step % 3 == 0:  # speculative: two drafts seen, then rejected
            processor.row_op(CountingHistory([*history, 7, 8]))
        history.append(9)
        CountingHistory.reads = 0
        processor.row_op(history)
        worst = max(worst, CountingHistory.reads)
    assert worst <= 2 * (ROLLBACK + 2) + 4, worst


class Opaque:
    """A history whose tokens must not be read: only its length is known."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):  # noqa: ANN001, ANN204
        raise AssertionError("the resident path read a token of a history")



PAYLOADS = [
    [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}],
    [{"kind": "banned_tokens", "token_ids": [3, 4]}, {"kind": "logit_bias", "bias": {"9": 2.0}}],
    [{"kind": "allowed_tokens", "token_ids": [5, 6], "eos_token_id": EOS},
     {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [EOS]}],
]


def _resident_ops(length: int) -> int:
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
    for slot, payload in enumerate(PAYLOADS):
        batch.assign(slot, sdk.realize(payload, vocab_size=V, stop_token_id=EOS))
    batch.set_rows(np.arange(len(PAYLOADS)))
    histories = [Opaque(length)] * len(PAYLOADS)
    batch.apply(torch.zeros(len(PAYLOADS), V), EngineStep(histories=histories))  # type: ignore[arg-type]
    with OpCounter() as counter:
        batch.apply(torch.zeros(len(PAYLOADS), V), EngineStep(histories=histories))  # type: ignore[arg-type]
    return counter.ops


def test_the_resident_path_reads_only_lengths_and_its_work_does_not_grow_with_them() -> None:
    assert _resident_ops(10) == _resident_ops(50_000)


def _device_thinking_ops(length: int) -> int:
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    thinking = DeviceThinking(3, "cpu")
    payload = [{"kind": "thinking_budget", "start_token_ids": [30], "end_token_ids": [31, 32], "budget": 4}]
    batch.assign(0, sdk.realize(payload, vocab_size=V, stop_token_id=EOS))
    thinking.assign(0, batch.requests[0])
    batch.set_rows(np.array([0]))
    tokens = torch.full((2, length + 8), 5, dtype=torch.int32)
    prompt = torch.tensor([2, 0], dtype=torch.int32)

    def step(n: int) -> None:
        thinking.step(tokens, prompt, prompt + torch.tensor([n, 0], dtype=torch.int32))
        batch.apply(torch.zeros(1, V), EngineStep(generated=torch.tensor([n]), thinking=thinking.decide))

    for n in range(1, length + 1):  # follow the whole history once, as a request would
        step(n)
    with OpCounter() as counter:
        step(length + 1)
    return counter.ops


def test_thinking_on_the_device_costs_the_same_late_in_a_long_sequence() -> None:
    assert _device_thinking_ops(8) == _device_thinking_ops(600)
