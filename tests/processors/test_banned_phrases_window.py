"""``banned_phrases`` decided from the token window (Model Runner V2) masks exactly what the host
walk (``BannedPhrasesProcessor.banned``) masks after each row's output: random phrase sets and
outputs over a small vocabulary, so prefixes match often, prompts of one token (a row's window
reaches before its start, into stale ``-1`` cells and the slot before), requests joining and
leaving (rows' layouts change, slots are reused)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor  # noqa: E402
from dynlogits.adapters.vllm.harness import V2SamplerHarness  # noqa: E402
from dynlogits.processors.banned_phrases import BannedPhrasesProcessor  # noqa: E402
from dynlogits.specs import WIRE_KEY  # noqa: E402

VOCAB = 12
EOS = 11


def _params(phrases: list[list[int]]) -> SamplingParams:
    params = SamplingParams(temperature=0.0, extra_args={WIRE_KEY: [{"kind": "banned_phrases", "phrases": phrases}]})
    params.update_from_generation_config({}, eos_token_id=EOS)
    return params


def _phrases(rng: random.Random) -> list[list[int]]:
    """Distinct phrases of 1-4 tokens below ``EOS`` (at least one of several tokens)."""
    made = {tuple(rng.randrange(EOS) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 8))}
    made.add(tuple(rng.randrange(EOS) for _ in range(rng.randint(2, 4))))
    return [list(p) for p in sorted(made)]


@pytest.mark.parametrize("seed", range(6))
def test_window_decided_step_masks_what_the_host_walk_masks(seed: int) -> None:
    rng = random.Random(seed)
    harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=VOCAB, max_num_reqs=6, max_model_len=48)
    harness.all_token_ids.cpu.fill_(-1)  # stale cells: a window reaching before a row's start reads them
    processors: dict[str, BannedPhrasesProcessor] = {}
    starts: dict[str, list[int]] = {}  # per request, its phrases' first tokens (of the longer ones)
    batch: list[str] = []
    made = 0

    def add() -> None:
        nonlocal made
        name, phrases = f"r{made}", _phrases(rng)
        made += 1
        prompt = [rng.randrange(EOS) for _ in range(rng.choice((1, 1, 2, 5)))]
        harness.add_request(name, prompt, _params(phrases))
        processors[name] = BannedPhrasesProcessor(phrases)
        starts[name] = [p[0] for p in phrases if len(p) > 1]
        batch.append(name)

    for _ in range(4):
        add()
    checked = 0
    for step in range(24):
        if step % 7 == 6:  # one leaves, one joins (its slot reused), the rows reordered
            gone = batch.pop(rng.randrange(len(batch)))
            harness.remove_request(gone)
            add()
            rng.shuffle(batch)
        logits = harness.step(batch, torch.zeros(len(batch), VOCAB))
        for row, name in enumerate(batch):
            got = torch.isneginf(logits[row]).nonzero().flatten().tolist()
            want = list(processors[name].banned(harness.output_ids(name)))
            assert got == want, (step, name, harness.output_ids(name))
            checked += len(want) > len(processors[name].banned(()))
        # the next tokens: often a phrase's prefix, so its last token is banned at the next step
        for name in batch:
            harness.commit(name, [rng.choice(starts[name]) if rng.random() < 0.6 else rng.randrange(EOS)])
    assert checked > 0  # some step masked ids beyond the one-token phrases


def test_the_cpu_route_reads_the_engines_token_buffer_as_it_is_at_each_step() -> None:
    """The CPU route keeps its view of the engine's token buffer across steps (``_tokens_view``):
    tokens rewritten in place are read at the next step, and a buffer whose storage was replaced
    (the same tensor at another address, the old storage still alive with the old tokens) is viewed
    anew. Each step masks what the op's reference masks on the buffer as it is then (prefill
    chunks' rows aside: their samples are discarded)."""
    from dynlogits.processors import banned_phrases
    from dynlogits.processors.slots import StepInputs
    from dynlogits.testing.cuda.banned_phrases_check import _host, group_case

    differed = 0
    for seed in range(12):
        case = group_case(seed, torch.device("cpu"), requests=2 + seed % 6, longest=(3, 9)[seed % 2])
        tokens = case.window.tokens
        # the rows whose sample counts: a prefill chunk's row (a member deciding nothing) is discarded
        sampled = torch.tensor([w is not None or not m for w, m in zip(case.wants, case.rows.member.tolist())])
        held = []
        generator = torch.Generator().manual_seed(seed)
        for change in ("none", "in place", "storage"):
            before = _host(case, case.logits.clone())  # (it writes into the logits it is given)
            other = torch.randint(0, 4, tokens.shape, generator=generator, dtype=tokens.dtype)  # ALPHABET's ids
            if change == "in place":
                tokens.copy_(other)
            elif change == "storage":  # the old storage kept alive by a tensor of its own
                held.append(torch.empty(0, dtype=tokens.dtype).set_(tokens.untyped_storage(), 0, tokens.shape))
                tokens.set_(other)
            want = _host(case, case.logits.clone())
            differed += change != "none" and not torch.equal(want, before)
            logits = case.logits.clone()
            step = StepInputs(logits, logits.view(-1), logits.shape[1], None, torch.empty(0, dtype=torch.long))
            decided = case.group.decide_from_window(case.rows, case.window)
            assert decided is banned_phrases._CPU_STEP
            case.group.apply_device_decisions(step, case.rows, decided)
            assert torch.equal(logits[sampled], want[sampled]), (seed, change)
    assert differed >= 6  # the premise: the rewritten buffers mask other ids
