"""``dry`` under vLLM's Model Runner V2, driven through its real classes (``LogitsProcRequestState``,
``LogitsContext``; ``dynlogits.adapters.vllm.harness``: V2 cannot run end to end on this CPU build):
every row, draft rows included (their history ends with the drafts before them), is what llama.cpp's
algorithm (the kit's oracle) makes of the prompt and the history it sees, with slots reused and
requests resumed, beside requests without it."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402
from dynlogits.testing.oracle import OracleRequest, expected_row  # noqa: E402

VOCAB = 32
EOS = 1


def _params(payload: list[dict[str, Any]] | None) -> SamplingParams:
    params = SamplingParams(temperature=0.0, extra_args=None if payload is None else {WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def _harness(drafts: int) -> V2SamplerHarness:
    from types import SimpleNamespace

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None,
                             use_v2_model_runner=True, model_config=None)
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=4, vllm_config=config)


@pytest.mark.parametrize("drafts", [0, 2])
def test_every_row_is_what_llama_cpps_algorithm_makes_of_its_history(drafts: int) -> None:
    rng = random.Random(5 + drafts)
    ids = [2, 3, 4, 5, 6]  # few ids: repeats on every step
    harness = _harness(drafts)
    live: dict[str, tuple[list[dict[str, Any]] | None, list[int]]] = {}
    penalized = 0
    for round_ in range(8):
        for name in [n for n in live if rng.random() < 0.4]:
            harness.remove_request(name)
            del live[name]
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            payload = None if rng.random() < 0.25 else [{
                "kind": "dry", "multiplier": rng.choice([0.5, 2.0]), "base": rng.choice([1.0, 1.75, 3.0]),
                "allowed_length": rng.randint(1, 3), "penalty_last_n": rng.choice([-1, 4, 12]),
                "sequence_breakers": [], "include_prompt": rng.random() < 0.7}]
            prompt = [rng.choice(ids) for _ in range(rng.randint(1, 6))]
            output = [rng.choice(ids) for _ in range(rng.choice([0, 2, 9]))]
            harness.add_request(name, prompt, _params(payload), output_ids=output)
            live[name] = (payload, prompt)
        batch = list(live)
        for _ in range(4):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            logits = torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB)
            out = harness.step(batch, logits.clone(), drafts=fed)
            row = 0
            for name in batch:
                payload, prompt = live[name]
                history = harness.output_ids(name)
                for k in range(1 + len(fed.get(name, ()))):
                    seen = [*history, *fed.get(name, [])[:k]]
                    want = logits[row].tolist() if payload is None else expected_row(
                        payload, seen, logits[row].tolist(), OracleRequest(prompt=prompt, stop_token_ids=(EOS,)))
                    penalized += want != logits[row].tolist()
                    assert out[row].tolist() == pytest.approx(want, rel=1e-5, abs=1e-5), (name, k, seen)
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids)])
    assert penalized > 20  # the premise: rows were penalized


@pytest.mark.parametrize("drafts", [0, 2])
def test_entries_that_fit_are_decided_on_the_device_bit_for_bit_as_the_hosted_processor(drafts: int) -> None:
    """Without multi-token breakers and with a bounded repeat (every entry here), a request is resident
    under Model Runner V2 (decided on the device from the token window, nothing read back), and every
    row, drafts included, equals the hosted processor's on the history it sees, bit for bit, with
    ``-inf``, ``+inf`` and NaN logits, slots reused and requests resumed."""
    from dynlogits.processors.base import RealizeContext
    from dynlogits.processors.dry import factory
    from dynlogits.specs.builtin.dry import DrySpec

    rng = random.Random(17 + drafts)
    ids = [3, 4, 5, 6]  # few ids: repeats on most steps
    harness = _harness(drafts)
    live: dict[str, tuple[dict[str, Any] | None, list[int]]] = {}
    penalized = 0
    for round_ in range(8):
        for name in [n for n in live if rng.random() < 0.4]:
            harness.remove_request(name)
            del live[name]
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            entry = None if rng.random() < 0.2 else {
                "kind": "dry", "multiplier": rng.choice([0.5, 2.0, 100.0]), "base": rng.choice([1.5, 1.75, 3.0, 100.0]),
                "allowed_length": rng.randint(1, 3), "penalty_last_n": rng.choice([-1, 4, 12, 40]),
                "sequence_breakers": [], "include_prompt": rng.random() < 0.7}
            prompt = [rng.choice(ids) for _ in range(rng.randint(1, 8))]
            output = [rng.choice(ids) for _ in range(rng.choice([0, 2, 9, 30]))]
            harness.add_request(name, prompt, _params(None if entry is None else [entry]), output_ids=output)
            live[name] = (entry, prompt)
        batch = list(live)
        assert not harness.processor._is_hosted.any()
        for _ in range(5):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            logits = torch.randn(len(batch) + sum(map(len, fed.values())), VOCAB) * 3
            logits[:, 2] = float("-inf")
            logits[0, 3], logits[-1, 4] = float("inf"), float("nan")
            out = harness.step(batch, logits.clone(), drafts=fed)
            row = 0
            for name in batch:
                entry, prompt = live[name]
                history = harness.output_ids(name)
                for k in range(1 + len(fed.get(name, ()))):
                    want = logits[row].clone()
                    if entry is not None:
                        host = factory(DrySpec.model_validate(entry), RealizeContext(VOCAB, prompt_ids=tuple(prompt)))
                        host([*history, *fed.get(name, [])[:k]], want)
                    penalized += not torch.equal(want.nan_to_num(), logits[row].nan_to_num())
                    assert torch.equal(out[row].isnan(), want.isnan()) and torch.equal(out[row].nan_to_num(), want.nan_to_num()), (
                        name, k, entry, prompt, history)
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids)])
    assert penalized > 40  # the premise: rows were penalized
