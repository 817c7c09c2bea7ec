"""The watermark's PRF and detector against vLLM 0.32's own (``vllm.v1.watermarking``), called as
vLLM calls them: ``PhiloxPRF(key).uniform(contexts, ids)`` (the CPU path of its Gumbel watermarker
and of its detector) and ``GumbelWatermarkDetector(key, context_width, prf="philox").detect(ids)``.
vLLM's CUDA path (``philox_gumbel_sample``, a Triton kernel, and a ``torch.compile`` of the same
function) runs the same arithmetic as its CPU path; this machine has no GPU."""

from __future__ import annotations

import random

import pytest
import torch

from dynlogits.processors.watermark_detect import WatermarkDetection, detect, gamma_survival
from dynlogits.processors.watermark_prf import context_state, gumbel_noise, uniform, uniform_from_state

watermarking = pytest.importorskip("vllm.v1.watermarking")

KEYS = [0, 1, 2**32 - 1, 2**32, 2**64 - 1, 0x0123456789ABCDEF]


def _random_contexts(rng: random.Random, rows: int, width: int) -> torch.Tensor:
    return torch.tensor([[rng.choice([-1, rng.randrange(2**31 - 1), rng.randrange(1000)]) for _ in range(width)]
                         for _ in range(rows)], dtype=torch.int64)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 8, 9, 16, 32])
def test_the_prf_is_vllms_bit_for_bit_on_random_contexts_and_keys(width: int) -> None:
    rng = random.Random(width)
    ids = torch.arange(4099)
    for key in [*KEYS, rng.getrandbits(64), rng.getrandbits(64)]:
        contexts = _random_contexts(rng, 6, width)
        theirs = watermarking.PhiloxPRF(key).uniform(contexts, ids)
        assert torch.equal(uniform(key, contexts, ids), theirs)
        for row in range(len(contexts)):  # the host-state path the processor uses: same values
            state = context_state(key, contexts[row].tolist())
            assert torch.equal(uniform_from_state(key, state, ids), theirs[row])


def test_the_prf_scores_per_row_targets_as_the_detector_asks_it() -> None:
    rng = random.Random(7)
    contexts = _random_contexts(rng, 50, 4)
    targets = torch.tensor([rng.randrange(151936) for _ in range(50)]).unsqueeze(-1)
    key = rng.getrandbits(64)
    assert torch.equal(uniform(key, contexts, targets), watermarking.PhiloxPRF(key).uniform(contexts, targets))


def test_a_changed_key_context_or_id_changes_the_values() -> None:
    ids = torch.arange(1000)
    base = uniform_from_state(5, context_state(5, [1, 2, 3, 4]), ids)
    assert not torch.equal(base, uniform_from_state(6, context_state(6, [1, 2, 3, 4]), ids))
    assert not torch.equal(base, uniform_from_state(5, context_state(5, [1, 2, 3, 5]), ids))
    assert len(set(base.tolist())) > 990  # distinct values per id
    assert bool((base > 0).all()) and bool((base < 1).all())


def test_keys_outside_64_bits_are_refused() -> None:
    with pytest.raises(ValueError, match=r"key: must be an integer in \[0, 2\*\*64 - 1\]"):
        context_state(2**64, [1])
    with pytest.raises(ValueError, match="key:"):
        uniform(-1, torch.zeros(1, 4, dtype=torch.long), torch.arange(3))


def test_the_noise_is_vllms() -> None:
    u = torch.tensor([0.0, 1e-30, 0.5, 1 - 2**-24])
    expected = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float32).tiny)))
    assert torch.equal(gumbel_noise(u), expected)


def _watermarked_ids(key: int, width: int, length: int, vocab: int, seed: int) -> list[int]:
    """Ids drawn by vLLM's own ``GumbelWatermarker`` (its CPU path) from random logits."""
    marker = watermarking.GumbelWatermarker(key, width)
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for _ in range(length):
        context = torch.tensor([([-1] * width + out)[-width:]])
        logits = torch.randn(1, vocab, generator=gen) * 2
        out.append(int(marker.sample(logits, context).token_ids[0]))
    return out


@pytest.mark.parametrize(("vocab", "width"), [(1000, 4), (1000, 1), (151936, 4), (50, 3)])
def test_the_detector_gives_vllms_p_value_on_random_and_watermarked_ids(vocab: int, width: int) -> None:
    rng = random.Random(vocab + width)
    key = rng.getrandbits(64)
    marked = _watermarked_ids(key, width, 60 if vocab > 1000 else 160, vocab, seed=vocab)
    samples = [marked, [rng.randrange(vocab) for _ in range(160)], [rng.randrange(3) for _ in range(200)], [], [7]]
    for ids in samples:
        theirs = watermarking.GumbelWatermarkDetector(key, width, prf="philox").detect(ids)
        ours = detect(ids, key=key, context_width=width, vocab_size=vocab)
        assert isinstance(ours, WatermarkDetection)
        assert (ours.score, ours.p_value, ours.num_scored_tokens, ours.is_watermarked) == (
            theirs.score, theirs.p_value, theirs.num_scored_tokens, theirs.is_watermarked)
    found = detect(marked, key=key, context_width=width, vocab_size=vocab)
    assert found.is_watermarked and found.p_value <= 1e-4
    assert not detect(marked, key=key ^ 1, context_width=width, vocab_size=vocab).is_watermarked


def test_the_gamma_survival_is_the_known_closed_form() -> None:
    assert gamma_survival(0.0, 5) == 1.0 and gamma_survival(3.0, 0) == 1.0
    assert gamma_survival(2.0, 1) == pytest.approx(float(torch.exp(torch.tensor(-2.0, dtype=torch.float64))))
    assert gamma_survival(3.0, 2) == pytest.approx(4 * 2.718281828459045 ** -3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"key": 2**64, "context_width": 4, "vocab_size": 10}, r"key: must be an integer in \[0, 2\*\*64 - 1\]"),
    ({"key": 1, "context_width": 0, "vocab_size": 10}, r"context_width: must be an integer in \[1, 32\]"),
    ({"key": 1, "context_width": 33, "vocab_size": 10}, r"context_width: must be"),
    ({"key": 1, "context_width": 4, "vocab_size": 3}, r"token_ids\[1\]: must be an integer in \[0, 3\)"),
])
def test_bad_arguments_are_refused_naming_the_argument_and_the_rule(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect([1, 5, 2], **kwargs)


def test_the_error_never_quotes_the_key() -> None:
    with pytest.raises(ValueError) as raised:
        detect([1], key=2**64 + 12345, context_width=4, vocab_size=10)
    assert "12345" not in str(raised.value)
