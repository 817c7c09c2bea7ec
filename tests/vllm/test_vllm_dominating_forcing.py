"""Forcing by one dominating logit samples exactly what masking samples, through vLLM's real V1
``Sampler`` with vLLM's own built-in processors (min_tokens, logit_bias, min_p) loaded beside the
adapter by vLLM's loader, over random batches of random sampling parameters: greedy, temperature,
top-k, top-p, min-p, repetition/frequency/presence penalties, logit_bias, min_tokens, allowed
ids and bad words, for several steps of each request's forced sequence.

Model Runner V2's sampler needs Triton kernels (no CPU backend), so it is not run here; what it
does after the adapter is read in ``dynlogits.adapters.vllm.sampling``. Speculative decoding is
not covered by dominance at all: V1's rejection sampler never runs custom processors on target
logits (``RejectionSampler.apply_logits_processors``, vLLM 0.32.0), and V2 with drafts uses the
masked layout, which always masks.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder, build_logitsprocs  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from dynlogits.adapters.vllm import PROCESSOR_FQCN, DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm import processor as vllm_processor  # noqa: E402
from dynlogits.adapters.vllm.sampling import dominance_is_exact  # noqa: E402
from dynlogits.sdk.forcing import DOMINATING_LOGIT  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

EOS = 1
BATCH = 8
STEPS = 7
TRIALS = 12


def _request(rng: random.Random, vocab: int, i: int) -> tuple[SamplingParams, list[int]]:
    tokens = [rng.randrange(2, vocab) for _ in range(rng.randint(2, 5))]
    payload: list[dict[str, Any]] = [{"kind": "forced_sequence", "token_ids": tokens, "eos_token_id": EOS}]
    extra = rng.random()
    if extra < 0.25:  # a later entry that bans a forced token now and then: the row fails alike
        payload.append({"kind": "banned_tokens", "token_ids": [rng.choice(tokens), rng.randrange(2, vocab)]})
    elif extra < 0.5:
        payload.append({"kind": "logit_bias", "bias": {str(rng.randrange(2, vocab)): rng.uniform(-100, 100)}})
    if rng.random() < 0.15:
        payload = [{"kind": "banned_tokens", "token_ids": [rng.randrange(2, vocab)]}]  # no forcing at all
    greedy = rng.random() < 0.25
    kw: dict[str, Any] = {
        "temperature": 0.0 if greedy else rng.choice([0.01, 0.3, 1.0, 2.0]),
        "top_k": rng.choice([0, 0, 1, 5, 40]),
        "top_p": rng.choice([1.0, 1.0, 0.9, 0.3, 0.01]),
        "min_p": rng.choice([0.0, 0.0, 0.1, 0.9]),
        "repetition_penalty": rng.choice([1.0, 1.0, 1.3, 0.7, 0.01, 100.0, 0.005]),
        "frequency_penalty": rng.choice([0.0, 1.5, -2.0]),
        "presence_penalty": rng.choice([0.0, 1.0, -1.0]),
        "min_tokens": rng.choice([0, 0, 2, 20]),
        "seed": 1000 + i,
        "max_tokens": 64,
        "extra_args": {WIRE_KEY: payload},
    }
    if rng.random() < 0.3:
        kw["logit_bias"] = {rng.randrange(2, vocab): rng.uniform(-100, 100) for _ in range(3)}
    if rng.random() < 0.2:
        kw["allowed_token_ids"] = sorted({EOS, *rng.sample(range(2, vocab), 30), *(tokens if rng.random() < 0.7 else [])})
    if rng.random() < 0.2:
        kw["bad_words"] = []  # set below as ids (the sampler takes ids; no tokenizer here)
    params = SamplingParams(**kw)
    params.update_from_generation_config({}, EOS)
    return params, [rng.randrange(2, vocab) for _ in range(rng.randint(3, 9))]


def _metadata(params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]], procs: Any,
              bad_words: dict[int, list[list[int]]], vocab: int, step: int) -> SamplingMetadata:
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    greedy = [p.temperature < 1e-5 for p in params]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], dtype=torch.int32)
    width = max(map(len, prompts))
    prompt_ids = torch.tensor([p + [vocab] * (width - len(p)) for p in prompts], dtype=torch.int64)
    allowed = None
    if any(p.allowed_token_ids for p in params):
        allowed = torch.zeros(len(params), vocab, dtype=torch.bool)
        for i, p in enumerate(params):
            if p.allowed_token_ids:
                allowed[i] = True
                allowed[i, p.allowed_token_ids] = False
    return SamplingMetadata(
        temperature=None if all(greedy) else temps,
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
        top_k=top_k,
        generators={i: torch.Generator().manual_seed(p.seed * 100 + step) for i, p in enumerate(params)},  # type: ignore[operator]
        max_num_logprobs=None,
        no_penalties=False,
        prompt_token_ids=prompt_ids,
        frequency_penalties=torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32),
        presence_penalties=torch.tensor([p.presence_penalty for p in params], dtype=torch.float32),
        repetition_penalties=torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32),
        output_token_ids=outputs,
        allowed_token_ids_mask=allowed,
        bad_words_token_ids=bad_words,
        logitsprocs=procs,
    )


def _run(vllm_config: Any, trial: int, *, dominate: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[int]], int]:
    """Sampled tokens per request over STEPS steps, and how many (row, step)s dominated."""
    vocab = vllm_config.model_config.get_vocab_size()
    rng = random.Random(trial)
    made = [_request(rng, vocab, i) for i in range(BATCH)]
    params, prompts = [m[0] for m in made], [m[1] for m in made]
    bad_words = {i: [[rng.randrange(2, vocab)]] for i, p in enumerate(params) if p.bad_words is not None}
    with monkeypatch.context() as mp:
        if not dominate:
            mp.setattr(vllm_processor, "dominance_is_exact", lambda *a, **k: False)
        procs = build_logitsprocs(vllm_config, torch.device("cpu"), False, False, (PROCESSOR_FQCN,))
        outputs: list[list[int]] = [[] for _ in params]
        builder = BatchUpdateBuilder()
        for i, (p, prompt) in enumerate(zip(params, prompts)):
            builder.added.append((i, p, prompt, outputs[i]))
        update = builder.get_and_reset(len(params))
        for proc in procs.all:
            proc.update_state(update)
        ours = next(p for p in procs.non_argmax_invariant if isinstance(p, DynamoVllmLogitsProcessor))
        dominated = 0
        sampler = Sampler()
        gen = torch.Generator().manual_seed(trial)
        for step in range(STEPS):
            logits = torch.randn(len(params), vocab, generator=gen) * 6.0
            logits[:, :: 97] += 40.0  # a few ids far above the rest
            if step:
                for proc in procs.all:
                    proc.update_state(None)
            meta = _metadata(params, prompts, outputs, procs, bad_words, vocab, step)
            seen: dict[str, torch.Tensor] = {}

            def spy(t: torch.Tensor, _apply: Any = ours.apply) -> torch.Tensor:
                out = _apply(t)
                seen["logits"] = out.clone()
                return out

            mp.setattr(ours, "apply", spy)
            torch.manual_seed(step)
            sampled = sampler(logits, meta).sampled_token_ids[:, 0].tolist()
            dominated += int((seen["logits"] == DOMINATING_LOGIT).sum())
            for out, token in zip(outputs, sampled):
                out.append(int(token))
    return outputs, dominated


@pytest.mark.parametrize("trial", range(TRIALS))
def test_dominating_forcing_samples_what_masking_samples(vllm_config: Any, trial: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    masked, none = _run(vllm_config, trial, dominate=False, monkeypatch=monkeypatch)
    dominated, count = _run(vllm_config, trial, dominate=True, monkeypatch=monkeypatch)
    assert none == 0  # the masking run never dominated
    assert count > 0, "no row was forced by dominance: the property was not exercised"
    assert dominated == masked


def test_dominating_rows_leave_the_other_ids_as_they_were(vllm_config: Any) -> None:
    """O(1) per row: only the forced id is written (masking would write the whole row)."""
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    params = SamplingParams(temperature=0.7, extra_args={WIRE_KEY: [{"kind": "forced_sequence", "token_ids": [5, 6],
                                                                      "eos_token_id": EOS}]})
    params.update_from_generation_config({}, EOS)
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [3, 4], []))
    proc.update_state(builder.get_and_reset(1))
    logits = torch.randn(1, proc.vocab_size)
    before = logits.clone()
    proc.apply(logits)
    changed = (logits != before).nonzero()[:, 1].tolist()
    assert changed == [5] and logits[0, 5] == DOMINATING_LOGIT


def test_a_forced_id_the_engine_masked_fails_the_request_alike(vllm_config: Any) -> None:
    """The forced id is ``-inf`` before the adapter (an allowed-ids mask): under dominance the row's
    stop token gets the dominating logit and nothing else changes; the request is failed."""
    proc = DynamoVllmLogitsProcessor(vllm_config, torch.device("cpu"), False)
    params = SamplingParams(temperature=1.0, extra_args={WIRE_KEY: [{"kind": "forced_sequence", "token_ids": [5],
                                                                      "eos_token_id": EOS}]})
    params.update_from_generation_config({}, EOS)
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [3], []))
    proc.update_state(builder.get_and_reset(1))
    logits = torch.randn(1, proc.vocab_size)
    logits[0, 5] = -math.inf
    proc.apply(logits)
    assert int(logits[0].argmax()) == EOS and logits[0, EOS] == DOMINATING_LOGIT
    proc.update_state(None)
    proc.apply(torch.randn(1, proc.vocab_size))  # the flag is read back at the next step
    assert any("no token left to sample" in f for f in proc.failures), list(proc.failures)


@pytest.mark.parametrize(("kw", "exact"), [
    ({}, True),
    ({"temperature": 0.0}, True),
    ({"temperature": 2.0}, True),
    ({"repetition_penalty": 0.01}, True),
    ({"repetition_penalty": 0.001}, False),
    ({"repetition_penalty": 1000.0}, False),
    ({"thinking_token_budget": 10}, False),
    ({"logit_bias": {5: 100.0}, "min_tokens": 3, "allowed_token_ids": [5, 6], "top_k": 3, "min_p": 0.5}, True),
])
def test_dominance_is_used_only_where_vllms_later_stages_cannot_overturn_it(kw: dict[str, Any], exact: bool) -> None:
    assert dominance_is_exact(SamplingParams(**kw)) is exact


def test_a_temperature_vllm_would_refuse_is_masked_all_the_same() -> None:
    """vLLM keeps temperatures in [0, 2]; the rule does not rely on it."""
    assert not dominance_is_exact(SimpleNamespace(temperature=1e7))
    assert not dominance_is_exact(SimpleNamespace(temperature=math.nan))


def test_processed_logprobs_keep_masking_for_requests_that_ask_for_logprobs() -> None:
    assert dominance_is_exact(SamplingParams(logprobs=2), processed_logprobs=False)
    assert not dominance_is_exact(SamplingParams(logprobs=2), processed_logprobs=True)
    assert dominance_is_exact(SamplingParams(), processed_logprobs=True)
