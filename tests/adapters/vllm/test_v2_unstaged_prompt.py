"""Model Runner V2 where the runner staged no write of a request's tokens, so realization gets no
prompt (``v2.staged_prompt`` returns ``None``; the adapter logs it once): a ``dry`` entry decided on
the device still counts the prompt, read from the runner's token matrix, while a hosted one (a
look-back over the device cap) sees the output alone, as docs/specs.md says. Driven through the
real V2 classes (``dynlogits.adapters.vllm.harness``)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm import v2 as v2_module  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402
from dynlogits.testing.oracle import OracleRequest, expected_row  # noqa: E402

VOCAB = 16
EOS = 1
#: decided on the device (a cap of 12 columns)
RESIDENT = {"kind": "dry", "multiplier": 2.0, "base": 1.75, "allowed_length": 1, "penalty_last_n": 12,
            "sequence_breakers": []}
#: hosted under V2: base 1 has no clamp, so the cap is the whole look-back (2048 > the device's 256)
HOSTED = {"kind": "dry", "multiplier": 2.0, "base": 1.0, "allowed_length": 1, "penalty_last_n": -1,
          "sequence_breakers": []}


def _params(payload: list[dict[str, Any]]) -> SamplingParams:
    params = SamplingParams(temperature=0.0, extra_args={WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def test_dry_without_a_staged_prompt_counts_it_on_the_device_and_not_where_hosted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(v2_module, "staged_prompt", lambda *args: None)
    config = SimpleNamespace(speculative_config=None, use_v2_model_runner=True, model_config=None)
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=2, vllm_config=config)
    rng = random.Random(3)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]  # repeats the output's first tokens extend
    with caplog.at_level("WARNING", logger="dynlogits.adapters.vllm"):
        slots = [harness.add_request("device", prompt, _params([RESIDENT]), output_ids=[7, 5]),
                 harness.add_request("hosted", prompt, _params([HOSTED]), output_ids=[7, 5])]
    assert "staged no write" in caplog.text and "dry" in caplog.text
    assert harness.processor._is_hosted[slots].tolist() == [False, True]
    differed = 0
    for _ in range(5):
        logits = torch.randn(2, VOCAB)
        out = harness.step(["device", "hosted"], logits.clone())
        for row, (name, entry, seen_prompt) in enumerate((("device", RESIDENT, prompt), ("hosted", HOSTED, []))):
            history = harness.output_ids(name)
            want = expected_row([entry], history, logits[row].tolist(),
                                OracleRequest(prompt=seen_prompt, stop_token_ids=(EOS,)))
            assert out[row].tolist() == pytest.approx(want, rel=1e-5, abs=1e-5), (name, history)
        with_prompt = expected_row([HOSTED], harness.output_ids("hosted"), logits[1].tolist(),
                                   OracleRequest(prompt=prompt, stop_token_ids=(EOS,)))
        differed += with_prompt != out[1].tolist()
        for name in ("device", "hosted"):
            harness.commit(name, [rng.choice([5, 6, 7])])
    assert differed  # the hosted row would differ had it seen the prompt: the test tells the two apart
