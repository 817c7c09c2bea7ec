"""Rows of the resident path against the hosted path, shared by the scoped kinds' tests: on the V1
runner's interface (``rows_v1_against_hosted``: a ``SlotBatch`` given live lists with placeholders),
and under Model Runner V2: a harness of vLLM's real V2 classes (the runner's buffers as plain tensors), sampling params as the engine
builds them, and a random run whose every row is checked against ``sdk.apply_rows`` of the
request's own realization on the history that row sees (its committed tokens and the drafts fed
before it)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from dynlogits import sdk
from dynlogits.processors.scope import ScopedDecided
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

#: a new request of a run: ``(payload, resident, prompt, output ids it resumes with, its hosted twin)``
Request = tuple[list[dict[str, Any]], bool, list[int], list[int], Any]


def v2_harness(drafts: int, vocab: int) -> Any:
    """A ``V2SamplerHarness`` of the adapter, ``drafts`` speculative tokens a request (0: none)."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.adapters.vllm.harness import V2SamplerHarness

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None,
                             use_v2_model_runner=True, model_config=None)
    return V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=vocab, max_num_reqs=5, vllm_config=config)


def v2_params(payload: list[dict[str, Any]], max_tokens: int, eos: int) -> Any:
    """Greedy ``SamplingParams`` carrying ``payload``, updated from a generation config as the engine does."""
    from vllm import SamplingParams

    from dynlogits.specs import WIRE_KEY

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args={WIRE_KEY: payload})
    params.update_from_generation_config({}, eos_token_id=eos)
    return params


#: picks the next token from what the hosted path left of a row (``[vocab]``), for entries that fail a
#: request whose tokens they do not allow (``multiple_choice``)
Choose = Callable[[random.Random, torch.Tensor], int]


def allowed_token(rng: random.Random, row: torch.Tensor) -> int:
    """A ``Choose``: one of the ids the row leaves finite."""
    return int(rng.choice(torch.isfinite(row).nonzero().flatten().tolist()))


def _hosted_row(hosted: Any, seen: list[int], vocab: int) -> torch.Tensor:
    """What the hosted path leaves of a random row after ``seen``."""
    row = torch.randn(1, vocab)
    sdk.apply_rows(row, [0], [hosted], [seen])
    return row[0]


def rows_against_hosted(drafts: int, rng: random.Random, new: Callable[[], Request], ids: Sequence[int], *,
                        vocab: int, eos: int, max_tokens: int, logits: Callable[[int], torch.Tensor],
                        same: Callable[[torch.Tensor, torch.Tensor], bool] = torch.equal,
                        choose: Choose | None = None) -> int:
    """Eight rounds: requests leave, new ones (``new``) fill four slots (each resident or hosted as
    it says), four steps of random drafts among ``ids`` and committed tokens (with ``choose``: drafts
    and tokens it picks among those the hosted path allows); every row ``same`` as the hosted path's
    on the history it sees; how many rows the entries changed."""
    harness = v2_harness(drafts, vocab)
    live: dict[str, tuple[list[dict[str, Any]], Any]] = {}
    changed = 0
    for round_ in range(8):
        for name in [n for n in live if rng.random() < 0.4]:
            harness.remove_request(name)
            del live[name]
        while len(live) < 4:
            name = f"r{round_}-{len(live)}"
            payload, resident, prompt, output, hosted = new()
            harness.add_request(name, prompt, v2_params(payload, max_tokens, eos), output_ids=output)
            slot = harness.reqs[name].slot
            assert harness.processor._is_resident[slot] == resident and harness.processor._is_hosted[slot] != resident
            live[name] = (payload, hosted)
        batch = list(live)
        for _ in range(4):
            fed = {n: [rng.choice(ids) for _ in range(rng.randint(0, drafts))] for n in batch} if drafts else {}
            if choose is not None:
                for name, tokens in fed.items():
                    for k in range(len(tokens)):
                        tokens[k] = choose(rng, _hosted_row(live[name][1], harness.output_ids(name) + tokens[:k], vocab))
            step = logits(len(batch) + sum(map(len, fed.values())))
            out = harness.step(batch, step.clone(), drafts=fed)
            row = 0
            first: dict[str, torch.Tensor] = {}  # each request's row after its committed tokens
            for name in batch:
                payload, hosted = live[name]
                for k in range(len(fed.get(name, [])) + 1):
                    seen = harness.output_ids(name) + fed.get(name, [])[:k]
                    want = step[row : row + 1].clone()
                    sdk.apply_rows(want, [0], [hosted], [seen])
                    assert same(out[row], want[0]), (name, payload, seen)
                    changed += int(not same(want[0], step[row]))
                    first.setdefault(name, want[0])
                    row += 1
            for name in batch:
                harness.commit(name, [rng.choice(ids) if choose is None else choose(rng, first[name])])
    assert not harness.processor.failures
    return changed


def paired_requests(rng: random.Random, payload: Callable[[], list[dict[str, Any]]],
                    realize: Callable[[list[dict[str, Any]], list[int]], Any], ids: Sequence[int], *,
                    longest_prompt: int = 4) -> Callable[[], tuple[list[Any], list[Any]]]:
    """A ``requests`` for ``rows_v1_against_hosted``: three ``payload()``s with random prompts among
    ``ids`` (1 to ``longest_prompt`` tokens), each realized twice (resident, hosted)."""
    def requests() -> tuple[list[Any], list[Any]]:
        payloads = [payload() for _ in range(3)]
        prompts = [[rng.choice(ids) for _ in range(rng.randint(1, longest_prompt))] for _ in payloads]
        return [realize(p, q) for p, q in zip(payloads, prompts)], [realize(p, q) for p, q in zip(payloads, prompts)]

    return requests


def resident_request(rng: random.Random, payload: Callable[[], list[dict[str, Any]]],
                     realize: Callable[[list[dict[str, Any]], list[int]], Any], ids: Sequence[int]) -> Callable[[], Request]:
    """A ``new`` for ``rows_against_hosted`` whose requests are all resident: a ``payload()`` with a
    prompt of 1 to 4 tokens and an output of 0, 1, 3 or 20 (past ``MAX_DEVICE_CATCH_UP``) among ``ids``."""
    def new() -> Request:
        made = payload()
        prompt = [rng.choice(ids) for _ in range(rng.randint(1, 4))]
        output = [rng.choice(ids) for _ in range(rng.choice([0, 1, 3, 20]))]
        return made, True, prompt, output, realize(made, prompt)

    return new


#: the V1 batches' layout: rows 0, 1, 2 hold slots 2, 0, 1 (reordered, as after a batch change)
V1_ROWS = (2, 0, 1)


def v1_batch(resident: Sequence[Any], vocab: int) -> SlotBatch:
    """A ``SlotBatch`` with host histories (the V1 runner's interface) holding the three ``resident``
    requests in slots 0..2, every one resident, laid out as ``V1_ROWS``."""
    batch = SlotBatch(num_slots=4, vocab_size=vocab, device="cpu", host_histories=True)
    for slot, request in enumerate(resident):
        assert request is not None and batch.assign(slot, request)
    batch.flush()
    batch.set_rows(np.array(V1_ROWS))
    return batch


def v1_left(request: Any, histories: Sequence[list[int]], vocab: int) -> tuple[SlotBatch, list[list[int]]]:
    """``request`` alone in a ``SlotBatch`` with host histories (the V1 runner's interface), one step
    per history in turn: the batch and, per step, the ids its row leaves finite."""
    batch = SlotBatch(num_slots=2, vocab_size=vocab, device="cpu", host_histories=True)
    assert batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    left = []
    for history in histories:
        logits = torch.zeros(1, vocab)
        batch.apply(logits, EngineStep(histories=[history]))
        left.append(torch.isfinite(logits[0]).nonzero().flatten().tolist())
    return batch, left


def v1_step(batch: SlotBatch, hosted: Sequence[Any], seen: list[list[int]], step: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of ``v1_batch``'s batch on ``seen`` (row-indexed) and the hosted path's on the same
    logits: ``(resident, hosted)`` copies of ``step``."""
    a, b = step.clone(), step.clone()
    batch.apply(a, EngineStep(histories=seen))
    sdk.apply_rows(b, [0, 1, 2], [hosted[slot] for slot in V1_ROWS], seen)
    return a, b


def rows_v1_against_hosted(rng: random.Random, requests: Callable[[], tuple[list[Any], list[Any]]],
                           ids: Sequence[int], *, vocab: int, steps: int, placeholders: float,
                           logits: Callable[[], torch.Tensor], same: Callable[[torch.Tensor, torch.Tensor], bool],
                           changed: Callable[[torch.Tensor, torch.Tensor], int], choose: Choose | None = None) -> int:
    """Thirty batches of three requests (``requests``: each's resident and hosted realization, all
    resident as ``ScopedDecided``) in a reordered layout, ``steps`` steps of live lists growing with
    placeholders (``placeholders`` of the time; filled in the next step, as vLLM's async scheduling
    does), seen as the list itself, one longer or a copy (with ``choose``: the token it picks among
    those the hosted path allowed, seen as the list or a copy): every step ``same`` as the hosted
    path; the sum of ``changed(resident logits, step logits)``."""
    total = 0
    for _ in range(30):
        resident, hosted = requests()
        batch = v1_batch(resident, vocab)
        assert all(isinstance(g, ScopedDecided) for g in batch.groups.values())
        live: list[list[int]] = [[], [], []]
        last: torch.Tensor | None = None  # the hosted rows of the last step
        for _ in range(steps):
            for i, h in enumerate(live):
                if choose is not None:  # from the empty history on
                    if last is not None:
                        h.append(choose(rng, last[i]))
                    continue
                if h and h[-1] == -1:  # the placeholder's token, known now, written in its place
                    h[-1] = rng.choice(ids)
                h.append(-1 if rng.random() < placeholders else rng.choice(ids))
            if choose is not None:
                seen = [h if rng.random() < 0.6 else list(h) for h in live]
            else:
                seen = [h if rng.random() < 0.6 else h + [-1] if rng.random() < 0.5 else list(h) for h in live]
            step = logits()
            a, b = v1_step(batch, hosted, seen, step)
            assert same(a, b), seen
            total += changed(a, step)
            last = b
        assert not any(r.failed for r in resident)
    return total
