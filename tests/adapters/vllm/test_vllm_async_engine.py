"""The adapter on a real ``AsyncLLM`` (multiprocessing on) whose KV cache is too small for the batch.

The engine (``async_engine`` in ``conftest``) has 5 KV blocks of 32 tokens, so when many requests
grow past their first block at once the scheduler must preempt some and recompute them later.
A preempted request comes back with every token it had generated; the forced sequence must
resume at the right position because processors derive it from the token history, not from a
step counter. Preemption is read from the engine's own iteration stats, so the test fails if
the setup stops causing it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from vllm_helpers import FORCED_TEXTS, forced_payload, params

pytestmark = pytest.mark.engine

SHORT_PROMPT = "Tell me something."


def _long(tokenizer: Any, text: str, min_tokens: int = 40) -> str:
    """``text`` repeated until it is ``min_tokens`` long, so its request outgrows one 32-token KV block."""
    out = text
    while len(tokenizer.encode(out, add_special_tokens=False)) < min_tokens:
        out = f"{out} {text}"
    return out


async def _generate_all(engine: Any, requests: list[tuple[str, Any]]) -> list[Any]:
    jobs = [engine.generate(SHORT_PROMPT, p, request_id=f"req-{i}") for i, (_, p) in enumerate(requests)]
    return list(await asyncio.gather(*jobs))


def test_forced_texts_survive_preemption_and_resumption(async_engine, embedded_tokenizer):
    texts = [_long(embedded_tokenizer, t) for t in (FORCED_TEXTS + FORCED_TEXTS)[:16]]
    sizes = [len(embedded_tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    prompt_len = len(embedded_tokenizer.encode(SHORT_PROMPT))
    assert min(sizes) + prompt_len > 32, "each request must need a second KV block"
    assert max(sizes) + prompt_len < 128, "each request must fit max_model_len"
    requests = [(t, params(forced_payload(embedded_tokenizer, t), max_tokens=127 - prompt_len)) for t in texts]
    before = sum(async_engine.preemptions)

    finals = async_engine.run(_generate_all(async_engine, requests))

    got = [(f.outputs[0].text, f.outputs[0].finish_reason) for f in finals]
    assert got == [(t, "stop") for t in texts]
    assert sum(async_engine.preemptions) > before, "the engine never preempted: the test proves nothing"


def test_a_malformed_payload_fails_only_its_own_async_request(async_engine, embedded_tokenizer):
    from vllm.exceptions import VLLMValidationError

    bad = params([{"kind": "logit_bias", "bias": {"7": float("nan")}}])
    with pytest.raises(VLLMValidationError, match=r'dynamo_logits\[0\]\.bias\["7"\]: must be a finite number'):
        async_engine.run(async_engine.generate(SHORT_PROMPT, bad, request_id="bad-0"))
    good = async_engine.run(
        async_engine.generate(SHORT_PROMPT, params(forced_payload(embedded_tokenizer, "Yes.")), request_id="good-0")
    )
    assert good.outputs[0].text == "Yes."
