"""The watermark PRF's batched forms (``uniform_from_states``: many rows' host states at once;
``absorb``: the contexts absorbed on the device, each row with its own key and width) against vLLM
0.32's own ``PhiloxPRF`` and the one-row forms, bit for bit."""

from __future__ import annotations

import random

import pytest
import torch

from dynlogits.processors.watermark_prf import absorb, context_state, key_words, uniform_from_state, uniform_from_states

watermarking = pytest.importorskip("vllm.v1.watermarking")

KEYS = [0, 1, 2**32 - 1, 2**32, 2**64 - 1, 0x0123456789ABCDEF]


def _context(rng: random.Random, width: int) -> list[int]:
    return [rng.choice([-1, rng.randrange(2**31 - 1), rng.randrange(1000)]) for _ in range(width)]


@pytest.mark.parametrize("width", [1, 3, 4, 5, 8, 32])
def test_many_rows_from_their_states_are_vllms_bit_for_bit(width: int) -> None:
    rng = random.Random(width)
    ids = torch.arange(1031)
    keys = [*KEYS, rng.getrandbits(64), rng.getrandbits(64)]
    contexts = [_context(rng, width) for _ in keys]
    states = torch.tensor([context_state(k, c) for k, c in zip(keys, contexts)], dtype=torch.int64)
    words = torch.tensor([key_words(k) for k in keys], dtype=torch.int64)
    got = uniform_from_states(states, words, len(ids))
    for row, (key, context) in enumerate(zip(keys, contexts)):
        theirs = watermarking.PhiloxPRF(key).uniform(torch.tensor([context]), ids)[0]
        assert torch.equal(got[row], theirs)
        assert torch.equal(uniform_from_state(key, context_state(key, context), ids), got[row])


@pytest.mark.parametrize("widths", [[4] * 6, [1, 2, 3, 4, 5, 9], [32, 1, 17, 4, 8, 12]])
def test_contexts_absorbed_on_the_device_are_the_host_states(widths: list[int]) -> None:
    rng = random.Random(sum(widths))
    keys = [*KEYS][: len(widths)]
    contexts = [_context(rng, w) for w in widths]
    wide = max(widths)
    padded = torch.tensor([c + [rng.randrange(50) for _ in range(wide - len(c))] for c in contexts], dtype=torch.int64)
    words = torch.tensor([key_words(k) for k in keys], dtype=torch.int64)
    same = len(set(widths)) == 1
    got = absorb(words, padded, None if same else torch.tensor(widths))
    assert got.tolist() == [list(context_state(k, c)) for k, c in zip(keys, contexts)]
