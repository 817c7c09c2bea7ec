"""``no_repeat_ngram`` under vLLM's Model Runner V2, through ``V2SamplerHarness``: resident (decided
on the device from the engine's token matrix, no read back), every row masking exactly what the
host processor masks for the history that row sees (committed tokens plus the drafts before it),
over random sizes, prompts (``include_prompt`` or not), outputs, drafts and reused slots; sizes
beyond the device bound are hosted and still equal."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.processors.no_repeat_ngram import KIND, NoRepeatNgramProcessor, banned_after  # noqa: E402
from dynlogits.processors.no_repeat_ngram_device import MAX_DEVICE_SIZE  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

VOCAB = 64
EOS = 1


def sp(payload: Any = None, max_tokens: int = 1000) -> SamplingParams:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=None if payload is None else {WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def _entry(size: int, include_prompt: bool) -> list[dict[str, Any]]:
    return [{"kind": KIND, "size": size, "include_prompt": include_prompt}]


def _masked(row: torch.Tensor) -> list[int]:
    return torch.isneginf(row).nonzero().flatten().tolist()


def _harness(drafts: int, max_model_len: int = 128) -> V2SamplerHarness:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None,
                             use_v2_model_runner=True, model_config=None)
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=5, vllm_config=config,
                            max_model_len=max_model_len)


@pytest.mark.parametrize(("drafts", "sizes"), [(0, (1, 5)), (2, (1, 5)), (0, (MAX_DEVICE_SIZE - 1, MAX_DEVICE_SIZE + 2)),
                                               (2, (2, MAX_DEVICE_SIZE + 2))])
def test_rows_mask_what_the_host_processor_masks(drafts: int, sizes: tuple[int, int]) -> None:
    rng = random.Random(drafts * 100 + sizes[1])
    ids = list(range(2, 5 if sizes[1] <= 5 else 4))  # few ids: the histories repeat n-grams
    harness = _harness(drafts)
    live: dict[str, tuple[int, bool, list[int]] | None] = {}
    checked = 0
    for round_ in range(10):
        for name in [n for n in live if rng.random() < 0.4]:
            harness.remove_request(name)
            del live[name]
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            size, with_prompt, plain = rng.randint(*sizes), rng.random() < 0.5, rng.random() < 0.15
            prompt = [rng.choice(ids) for _ in range(rng.randint(1, 12))]
            harness.add_request(name, prompt, sp(None if plain else _entry(size, with_prompt)),
                                output_ids=[rng.choice(ids) for _ in range(rng.randint(0, 30))])
            live[name] = None if plain else (size, with_prompt, prompt)
            if not plain:
                resident = harness.processor._is_resident[harness.reqs[name].slot]
                assert resident == (size <= MAX_DEVICE_SIZE), (size, resident)
        batch = list(live)
        for _ in range(3):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            out = harness.step(batch, torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB), drafts=fed)
            row = 0
            for name in batch:
                for k in range(len(fed.get(name, [])) + 1):
                    seen = harness.output_ids(name) + fed.get(name, [])[:k]
                    entry = live[name]
                    want: list[int] = []
                    if entry is not None:
                        size, with_prompt, prompt = entry
                        want = sorted(NoRepeatNgramProcessor(size, VOCAB, prompt if with_prompt else ()).banned(seen))
                        assert want == sorted(banned_after((prompt if with_prompt else []) + seen, size))
                    assert _masked(out[row]) == want, (name, entry, seen)
                    checked += bool(want)
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids)])
    assert checked > 5  # rows that mask something were seen


def test_a_history_filling_the_token_matrix_is_read_whole() -> None:
    harness = _harness(0, max_model_len=24)
    prompt = [2, 3, 9] + [4] * 10
    harness.add_request("a", prompt, sp(_entry(2, True)), output_ids=[5] * 9 + [2])  # 23 tokens: the last slot is the sample's
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    out = harness.step(["a"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == [3]  # the prompt's first bigram, 22 positions back


def test_placeholders_are_never_taken_for_tokens() -> None:
    """The newest slot's ``-1`` (async scheduling) in the window or after it bans nothing by itself."""
    harness = _harness(0)
    harness.add_request("a", [7, 8], sp(_entry(2, False)), output_ids=[3, 4, -1, 3])
    out = harness.step(["a"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == sorted(banned_after([3, 4, -1, 3], 2)) == [4]
    harness.add_request("b", [7, 8], sp(_entry(2, False)), output_ids=[3, -1, 5, -1])
    out = harness.step(["b"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == []


@pytest.mark.parametrize("include_prompt", [False, True])
def test_a_prefill_chunks_row_never_fails_its_request(include_prompt: bool) -> None:
    """Under chunked prefill a prompt chunk's row (at its last token, its sample discarded) must not
    fail the request, even where the chunk's n-grams would ban every id another entry allows; the
    first real row then masks what the host processor masks."""
    prompt = [9, 5, 9, 6, 9, 3, 3]
    payload = [{"kind": "allowed_tokens", "token_ids": [5, 6]}, *_entry(2, include_prompt)]
    harness = _harness(0)
    harness.add_request("c", prompt, sp(payload))
    for end in (3, 5):  # the chunk [9, 5, 9, 6, 9] bans 5 and 6 after 9
        harness.step(["c"], torch.zeros(1, VOCAB), chunks={"c": end})
    out = harness.step(["c"], torch.zeros(1, VOCAB))
    assert not harness.processor.failures
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [5, 6]


def test_the_window_is_no_wider_than_the_members_positions() -> None:
    """Where every member's prompt and ``max_tokens`` are known, the device reads no more of the
    token matrix than the longest of them, and every row within them masks what the host masks."""
    harness = _harness(0)
    prompt = [2, 3, 2, 4]
    harness.add_request("a", prompt, sp(_entry(2, True), max_tokens=6), output_ids=[3, 2])
    out = harness.step(["a"], torch.zeros(1, VOCAB))
    assert _masked(out[0]) == sorted(banned_after(prompt + [3, 2], 2)) == [3, 4]
    (group,) = [g for g in harness.processor._resident.groups.values() if g.from_window]
    assert group.width == 11  # 4 + 6 of 128, plus size - 1


#: no ``include_prompt``: the CUDA model's V2 runner stages no prompt (such a request fails at admission)
_ON_THE_DEVICE = [[{"kind": KIND, "size": 3}], [{"kind": KIND, "size": 2}]]


@pytest.mark.parametrize("drafts", [0, 2])
def test_a_steady_step_on_the_cuda_model_is_the_fused_op_and_never_waits(drafts: int) -> None:
    """The step's decisions and bans are one fused op (one Triton launch on CUDA); with drafts the
    runner's own bookkeeping adds its few ops; no sync either way."""
    from dynlogits.testing.cuda.drive import Scenario, drive_v2
    from dynlogits.testing.cuda.simcuda import SimCuda

    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=4, payloads=_ON_THE_DEVICE, steps=8, changes=False), drafts=drafts)
    assert [str(s) for s in steady.syncs] == [] and steady.failures == []
    assert steady.steady_ops.count("no_repeat_ngram_ban_") == 1 and steady.steady_ops[-1] == "no_repeat_ngram_ban_"
    assert steady.launches <= 8
    if not drafts:
        assert steady.steady_ops == ["no_repeat_ngram_ban_"]


def test_where_the_fused_kernel_is_off_the_eager_device_path_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA device whose probe failed runs ``apply_eager``: still no sync, nine ops a steady step."""
    from dynlogits.processors import no_repeat_ngram_device
    from dynlogits.testing.cuda.drive import Scenario, drive_v2
    from dynlogits.testing.cuda.simcuda import SimCuda

    monkeypatch.setattr(no_repeat_ngram_device._GATE, "ready", lambda device: False)  # as a failed probe leaves it
    with SimCuda() as sim:
        steady = drive_v2(sim, Scenario(vocab=4, payloads=_ON_THE_DEVICE, steps=8, changes=False))
    assert [str(s) for s in steady.syncs] == [] and steady.failures == []
    assert steady.steady_ops == ["addcmul", "index", "clamp", "bitwise_or", "bitwise_xor", "le", "all", "where",
                                 "scatter_reduce_"]
