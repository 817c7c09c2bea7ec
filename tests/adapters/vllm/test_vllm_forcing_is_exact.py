"""Forcing is exact through vLLM's real V1 ``Sampler``: whatever the sampling parameters, the
logprobs asked for and the logits the model emits, a forced row samples its forced token (or, when
the engine masked it, its stop token, and the request fails), and every other id is ``-inf`` in
the processed logits and logprobs.

vLLM's built-in processors (min_tokens, logit_bias, min_p) are loaded beside the adapter by vLLM's
own loader; random batches mix greedy, temperature, top-k, top-p, min-p, repetition/frequency/
presence penalties, logit_bias, min_tokens, allowed ids and bad words. Model Runner V2's sampler
needs Triton kernels (no CPU backend): its ``return_sampling_mask`` support is checked on the
processed logits in ``test_vllm_model_runner_v2``.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdateBuilder, build_logitsprocs  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from dynlogits.adapters.vllm import PROCESSOR_FQCN, DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

EOS = 1
BATCH = 8
STEPS = 5
TRIALS = 6


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
              bad_words: dict[int, list[list[int]]], vocab: int, step: int,
              logprob_token_ids: dict[int, list[int]] | None = None) -> SamplingMetadata:
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
        logprob_token_ids=logprob_token_ids,
    )


def _installed(vllm_config: Any, params: list[SamplingParams], prompts: list[list[int]],
               outputs: list[list[int]]) -> tuple[Any, DynamoVllmLogitsProcessor]:
    """vLLM's loader builds its processors and ours; the batch is added as the V1 runner adds it."""
    procs = build_logitsprocs(vllm_config, torch.device("cpu"), False, False, (PROCESSOR_FQCN,))
    builder = BatchUpdateBuilder()
    for i, (p, prompt) in enumerate(zip(params, prompts)):
        builder.added.append((i, p, prompt, outputs[i]))
    update = builder.get_and_reset(len(params))
    for proc in procs.all:
        proc.update_state(update)
    return procs, next(p for p in procs.non_argmax_invariant if isinstance(p, DynamoVllmLogitsProcessor))


def _spy(monkeypatch: pytest.MonkeyPatch, ours: DynamoVllmLogitsProcessor) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    real = ours.apply

    def spy(t: torch.Tensor) -> torch.Tensor:
        out = real(t)
        seen["logits"] = out.clone()
        return out

    monkeypatch.setattr(ours, "apply", spy)
    return seen


def _forcing(params: SamplingParams) -> bool:
    payload = (params.extra_args or {}).get(WIRE_KEY, [])
    return any(e["kind"] == "forced_sequence" for e in payload)


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_forced_row_samples_the_one_id_the_adapter_left_under_any_sampling_parameters(
        vllm_config: Any, trial: int, monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = vllm_config.model_config.get_vocab_size()
    rng = random.Random(trial)
    made = [_request(rng, vocab, i) for i in range(BATCH)]
    params, prompts = [m[0] for m in made], [m[1] for m in made]
    bad_words = {i: [[rng.randrange(2, vocab)]] for i, p in enumerate(params) if p.bad_words is not None}
    outputs: list[list[int]] = [[] for _ in params]
    procs, ours = _installed(vllm_config, params, prompts, outputs)
    seen = _spy(monkeypatch, ours)
    sampler = Sampler()
    gen = torch.Generator().manual_seed(trial)
    forced_rows = 0
    for step in range(STEPS):
        logits = torch.randn(len(params), vocab, generator=gen) * 6.0
        logits[:, ::97] += 40.0  # a few ids far above the rest
        if step:
            for proc in procs.all:
                proc.update_state(None)
        torch.manual_seed(step)
        sampled = sampler(logits, _metadata(params, prompts, outputs, procs, bad_words, vocab, step))
        for row, token in enumerate(sampled.sampled_token_ids[:, 0].tolist()):
            if _forcing(params[row]):
                left = torch.isfinite(seen["logits"][row]).nonzero().flatten().tolist()
                assert left == [token], (trial, step, row, left, token)
                forced_rows += 1
            outputs[row].append(int(token))
    assert forced_rows > 0, "no forced row: the property was not exercised"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_model_logits_never_beat_the_forced_token(vllm_config: Any, temperature: float,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM does not sanitise the model's logits: a NaN or ``+inf`` elsewhere in the row would win an
    argmax or poison a softmax. The forced token is sampled all the same."""
    vocab = vllm_config.model_config.get_vocab_size()
    params = SamplingParams(temperature=temperature, seed=3,
                            extra_args={WIRE_KEY: [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}]})
    params.update_from_generation_config({}, EOS)
    outputs: list[list[int]] = [[]]
    procs, _ = _installed(vllm_config, [params], [[3, 4]], outputs)
    for step, want in enumerate([5, 6, EOS]):
        logits = torch.randn(1, vocab)
        logits[0, 9] = math.nan
        logits[0, 11] = math.inf
        logits[0, 13] = 1e30
        if step:
            for proc in procs.all:
                proc.update_state(None)
        out = Sampler()(logits, _metadata([params], [[3, 4]], outputs, procs, {}, vocab, step))
        token = int(out.sampled_token_ids[0, 0])
        assert token == want, (step, token)
        outputs[0].append(token)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_logprobs_of_chosen_ids_are_those_of_a_masked_row(vllm_config: Any, mode: str) -> None:
    """``logprob_token_ids`` (asked for with ``logprobs=None``) are gathered from the processed row:
    every id but the forced one is ``-inf``; the forced one is certain (logprob 0, logit 0)."""
    vocab = vllm_config.model_config.get_vocab_size()
    params = SamplingParams(temperature=0.8, seed=1, logprob_token_ids=[3, 5, 7],
                            extra_args={WIRE_KEY: [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": EOS}]})
    params.update_from_generation_config({}, EOS)
    assert params.logprobs is None and params.num_logprobs == 3
    outputs: list[list[int]] = [[]]
    procs, _ = _installed(vllm_config, [params], [[3, 4]], outputs)
    meta = _metadata([params], [[3, 4]], outputs, procs, {}, vocab, 0, logprob_token_ids={0: [3, 5, 7]})
    out = Sampler(logprobs_mode=mode)(torch.randn(1, vocab), meta)
    assert int(out.sampled_token_ids[0, 0]) == 5
    tensors = out.logprobs_tensors
    assert tensors is not None
    assert tensors.logprob_token_ids[0].tolist() == [5, 3, 5, 7]  # the sampled id first
    assert tensors.logprobs[0].tolist() == [0.0, -math.inf, 0.0, -math.inf]


def test_a_forced_id_the_engine_masked_fails_the_request_and_samples_its_stop_token(vllm_config: Any) -> None:
    """The forced id is ``-inf`` before the adapter (an allowed-ids mask): the row is left with its
    stop token alone and the request fails, reported once the flag is back (on the CPU: at once)."""
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
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    assert any("no token left to sample" in f for f in proc.failures), list(proc.failures)
