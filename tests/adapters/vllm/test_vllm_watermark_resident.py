"""``watermark`` resident on both vLLM runners (real ``DynamoVllmLogitsProcessor``, V1 runner through
the kit's ``BatchUpdateBuilder`` driver, Model Runner V2 through ``V2SamplerHarness``): every row
equals the hosted processor's (``WatermarkProcessor`` on the row the entries before it leave) bit
for bit, over random histories, keys, widths, temperatures (greedy ones included), repeated
contexts and batch changes; a request that truncates (``top_k``) stays hosted and is still exact."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm.conformance import VllmV1Driver, VllmV2Driver  # noqa: E402
from dynlogits.processors.watermark import WatermarkProcessor  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

VOCAB = 1024
EOS = 1
BANNED = 5


class _Request:
    def __init__(self, rng: random.Random, name: str, *, top_k: int | None = None) -> None:
        self.name = name
        self.key = rng.getrandbits(64)
        self.width = rng.choice([1, 2, 3, 4, 4, 4, 7])
        self.temperature = rng.choice([0.0, 0.5, 0.7, 1.0, 1.0, 1.3])
        self.banned = rng.random() < 0.5
        # a small alphabet repeats contexts (left to the engine, as vLLM leaves them)
        self.alphabet = rng.choice([3, 6, VOCAB])
        self.prompt = [rng.randrange(2, 50) for _ in range(rng.randrange(1, 5))]
        self.output = [rng.randrange(2, 2 + self.alphabet) for _ in range(rng.choice([0, 0, 2, 9, 30]))]
        self.top_k = top_k
        payload: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": [BANNED]}] if self.banned else []
        self.payload = [*payload, {"kind": "watermark", "key": self.key, "context_width": self.width}]
        self.reference = WatermarkProcessor(self.key, self.width, temperature=self.temperature, top_k=top_k)

    def params(self) -> SamplingParams:
        params = SamplingParams(extra_args={WIRE_KEY: self.payload}, temperature=self.temperature,
                                top_k=self.top_k if self.top_k is not None else 0)
        params.update_from_generation_config({}, EOS)
        return params

    def want(self, raw: torch.Tensor) -> torch.Tensor:
        row = raw.clone()
        if self.banned:
            row[BANNED] = float("-inf")
        self.reference(list(self.output), row)
        return row


def _logits(rng: random.Random, rows: int, alphabet: list[int]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.getrandbits(31))
    raw = torch.randn(rows, VOCAB, generator=gen)
    for i, a in enumerate(alphabet):  # keep a small-alphabet request within it (repeats stay likely)
        if a < VOCAB:
            raw[i, 2 + a:] -= 30.0
    return raw


def _add(driver: Any, request: _Request) -> None:
    if isinstance(driver, VllmV1Driver):
        driver.requests[request.name] = (request.params(), list(request.prompt), request.output)
    else:
        driver.harness.add_request(request.name, request.prompt, request.params(), output_ids=request.output)
        driver._held[request.name] = len(request.prompt) + len(request.output)


def _resident(driver: Any) -> int:
    """How many watermark entries the runner's slot engine holds (resident)."""
    return sum(isinstance(p, WatermarkProcessor) for r in driver.processor._resident.requests
               if r is not None and r.processor is not None for p in r.processor.processors)


@pytest.mark.parametrize("runner", ["vllm-v1", "vllm-v2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resident_rows_are_the_hosted_processors_bit_for_bit(runner: str, seed: int) -> None:
    rng = random.Random(seed)
    driver: Any = VllmV1Driver(VOCAB) if runner == "vllm-v1" else VllmV2Driver(VOCAB)
    waiting = [_Request(rng, f"r{i}") for i in range(12)]
    waiting.append(_Request(rng, "truncating", top_k=20))
    live: list[_Request] = []
    drawn = 0
    for step in range(24):
        if step % 4 == 0:  # a batch change: some leave, some enter
            for request in rng.sample(live, k=min(len(live), rng.randrange(0, 3))):
                live.remove(request)
                if runner == "vllm-v2":
                    driver.harness.remove_request(request.name)
            while waiting and len(live) < 6:
                request = waiting.pop()
                _add(driver, request)
                live.append(request)
            rng.shuffle(live)
        raw = _logits(rng, len(live), [r.alphabet for r in live])
        want = [r.want(raw[i]) for i, r in enumerate(live)]
        if runner == "vllm-v1":
            out = driver.step([r.name for r in live], raw.clone())
        else:
            out = driver.harness.step([r.name for r in live], raw.clone())
        assert _resident(driver) >= 1
        for i, request in enumerate(live):
            assert torch.equal(out[i], want[i]), (step, request.name)
            token = int(out[i].argmax())
            drawn += int(torch.isfinite(out[i]).sum() == 1)
            if runner == "vllm-v1":
                request.output.append(token)
            else:
                driver.harness.commit(request.name, [token])
                request.output.append(token)
    assert not driver.failures()
    assert drawn > 20


@pytest.mark.parametrize("runner", ["vllm-v1", "vllm-v2"])
def test_a_request_that_samples_without_truncation_is_resident_and_one_with_top_k_is_hosted(runner: str) -> None:
    rng = random.Random(7)
    driver: Any = VllmV1Driver(VOCAB) if runner == "vllm-v1" else VllmV2Driver(VOCAB)
    plain, truncating = _Request(rng, "plain"), _Request(rng, "truncating", top_k=20)
    plain.temperature = truncating.temperature = 1.0
    for request in (plain, truncating):
        _add(driver, request)
    raw = torch.randn(2, VOCAB)
    if runner == "vllm-v1":
        driver.step(["plain", "truncating"], raw.clone())
    else:
        driver.harness.step(["plain", "truncating"], raw.clone())
    held = [p for r in driver.processor._resident.requests if r is not None and r.processor is not None
            for p in r.processor.processors if isinstance(p, WatermarkProcessor)]
    assert len(held) == 1 and held[0].top_k is None


def test_model_runner_v2_draft_rows_are_the_hosted_processors_on_each_drafts_history() -> None:
    """Speculative decoding (one row per draft token, the gathered layout): row ``k`` of a request is
    the hosted processor on the committed tokens and the first ``k`` drafts; a row after a
    placeholder draft (a request still in prefill, whose rows the runner discards) is not drawn."""
    rng = random.Random(11)
    driver = VllmV2Driver(VOCAB)
    requests = [_Request(rng, f"d{i}") for i in range(4)]
    for request in requests:
        request.temperature = rng.choice([0.6, 1.0])
        request.reference = WatermarkProcessor(request.key, request.width, temperature=request.temperature)
        _add(driver, request)
    for step in range(8):
        drafts = {r.name: [rng.randrange(2, 2 + min(r.alphabet, 40)) for _ in range(rng.randrange(0, 3))] for r in requests}
        if step == 3:
            drafts[requests[0].name] = [-1, -1]
        rows = sum(1 + len(d) for d in drafts.values())
        raw = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(step))
        want, at = [], 0
        for r in requests:
            for k in range(1 + len(drafts[r.name])):
                row = raw[at].clone()
                if r.banned:
                    row[BANNED] = float("-inf")
                seen = drafts[r.name][:k]
                if -1 not in seen:  # a placeholder draft before the row: no watermark there
                    r.reference([*r.output, *seen], row)
                want.append(row)
                at += 1
        out = driver.harness.step([r.name for r in requests], raw.clone(), drafts=drafts)
        assert _resident(driver) == len(requests)
        for i, row in enumerate(want):
            assert torch.equal(out[i], row), (step, i)
        at = 0
        for r in requests:
            token = int(out[at].argmax())
            driver.harness.commit(r.name, [token])
            r.output.append(token)
            at += 1 + len(drafts[r.name])
    assert not driver.failures()


@pytest.mark.parametrize("distance", [8191, 8192, 8193])
def test_model_runner_v2_repeats_are_looked_for_within_vllms_max_history_on_the_device(distance: int) -> None:
    """The context's last occurrence ``distance`` positions back: within ``MAX_HISTORY`` (8192) the
    step is left to the engine, beyond it drawn, as the hosted processor decides."""
    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.adapters.vllm.conformance import _vllm_config
    from dynlogits.adapters.vllm.harness import V2SamplerHarness

    rng = random.Random(distance)
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=2, max_model_len=8400,
                               vllm_config=_vllm_config(VOCAB))
    context = [7, 8, 9, 10]
    n = 8300
    output = [rng.randrange(100, VOCAB) for _ in range(n)]  # no accidental repeat of the context
    output[n - 4:] = context
    q = n - distance  # the context of position q (tokens q - 4 .. q - 1) is the step's
    output[q - 4 : q] = context
    request = _Request(rng, "long")
    request.temperature, request.width, request.banned = 1.0, 4, False
    request.payload = [{"kind": "watermark", "key": request.key, "context_width": 4}]
    request.reference = WatermarkProcessor(request.key, 4, temperature=1.0)
    request.output = output
    harness.add_request("long", [3, 4], request.params(), output_ids=output)
    raw = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(distance))
    want = request.want(raw[0])
    out = harness.step(["long"], raw.clone())
    assert torch.equal(out[0], want)
    assert (torch.isfinite(out[0]).sum() == 1) == (distance > 8192)


@pytest.mark.parametrize("runner", ["vllm-v1", "vllm-v2"])
def test_greedy_requests_are_resident_and_left_as_they_are(runner: str) -> None:
    rng = random.Random(3)
    driver: Any = VllmV1Driver(VOCAB) if runner == "vllm-v1" else VllmV2Driver(VOCAB)
    requests = [_Request(rng, f"g{i}") for i in range(3)]
    for request in requests:
        request.temperature = 0.0
        request.reference = WatermarkProcessor(request.key, request.width, temperature=0.0)
        _add(driver, request)
    for step in range(3):
        raw = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(step))
        want = [r.want(raw[i]) for i, r in enumerate(requests)]
        step_rows = driver.step if runner == "vllm-v1" else driver.harness.step
        out = step_rows([r.name for r in requests], raw.clone())
        assert _resident(driver) == 3
        for i, request in enumerate(requests):
            assert torch.equal(out[i], want[i])
            assert torch.isfinite(out[i]).sum() >= VOCAB - 1  # not forced
            token = int(out[i].argmax())
            if runner == "vllm-v2":
                driver.harness.commit(request.name, [token])
            request.output.append(token)
