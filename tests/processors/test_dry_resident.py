"""``dry`` kept per row across steps and on the resident path: a live history list grown, rewritten
at its tail, jumped ahead and holding a placeholder agrees with llama.cpp's algorithm
(``dynlogits.testing.dry_reference``) at every step; on a ``SlotBatch`` given the rows' histories
(vLLM's V1 runner) every row equals its host-path twin's bit for bit through batch changes, dtypes
and non-finite logits; a raising row fails its request alone; hosted without host histories."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from dry_histories import grow

from dynlogits import sdk
from dynlogits.processors import dry_native
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.dry import DryProcessor, factory
from dynlogits.processors.dry_group import DryGroup, DryTemplate
from dynlogits.processors.vocabulary import Vocabulary
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs.builtin.dry import DrySpec
from dynlogits.testing.dry_reference import dry_penalties

#: ``:`` (3) breaks alone; ``<`` (4) breaks when ``br>`` (5) follows; 16 ids, the logits' width
VOCAB = ("a", "b", "c", ":", "<", "br>", "y", "<br>", "d", "e", "f", "g", "h", "i", "j", "k")
W = len(VOCAB)
EOS = 15
BREAKER_SETS = [[], ["\n", ":", '"', "*"], [":"], ["<br>"], [":", "<br>", "c"]]


@pytest.fixture(scope="module", autouse=True)
def _native_step() -> None:
    """The resident rows below run on ``dry``'s native host step from their first step, where this
    machine builds it (``test_dry_native.py``; else on the Python processors)."""
    dry_native.library(wait=True)


def _vocabulary() -> Vocabulary:
    return Vocabulary(lambda: VOCAB)


def _random_entry(rng: random.Random) -> dict[str, Any]:
    return {"kind": "dry", "multiplier": rng.choice([0.8, 3.0]), "base": rng.choice([1.0, 1.75, 3.0, 100.0]),
            "allowed_length": rng.randint(1, 4), "penalty_last_n": rng.choice([-1, 4, 16, 64]),
            "sequence_breakers": rng.choice(BREAKER_SETS), "include_prompt": rng.random() < 0.7}


def _processor(entry: dict[str, Any], prompt: list[int]) -> DryProcessor:
    return factory(DrySpec.model_validate(entry), RealizeContext(W, prompt_ids=tuple(prompt), tokenizer_vocabulary=_vocabulary()))


def _expected(entry: dict[str, Any], prompt: list[int], history: list[int]) -> dict[int, float]:
    return dry_penalties(entry, [*prompt, *history] if entry["include_prompt"] else history, VOCAB)


def _got(processor: DryProcessor, history: list[int]) -> dict[int, float]:
    ids, pens = processor.penalties(history, W)
    return dict(zip(ids.tolist(), pens.tolist()))


@pytest.mark.parametrize("seed", range(6))
def test_a_live_list_kept_across_steps_agrees_with_llama_cpp_at_every_step(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(12):
        entry = _random_entry(rng)
        alphabet = rng.randint(2, W)
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(0, 12))]
        processor = _processor(entry, prompt)
        live: list[int] = []
        other: list[int] = [rng.randrange(alphabet) for _ in range(5)]  # a second row of the same request
        for step in range(rng.choice([40, 120])):
            grow(rng, live, alphabet)
            assert _got(processor, live) == _expected(entry, prompt, live), (entry, prompt, live, step)
            if step % 7 == 0:
                grow(rng, other, alphabet)
                other = list(other)  # a fresh list: compared whole
                assert _got(processor, other) == _expected(entry, prompt, other), (entry, prompt, other)


def test_a_loop_longer_than_the_look_back_slides_its_window_exactly() -> None:
    entry = {"kind": "dry", "multiplier": 1.0, "base": 1.75, "allowed_length": 2, "penalty_last_n": 64,
             "sequence_breakers": [":"], "include_prompt": True}
    processor = _processor(entry, [0, 1, 2])
    live: list[int] = []
    loop = [0, 1, 2, 6, 8, 9, 3, 1, 2]
    for step in range(400):
        live.append(loop[step % len(loop)] if step % 53 else 10)
        assert _got(processor, live) == _expected(entry, [0, 1, 2], live), step


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=W, stop_token_id=EOS,
                          facts=sdk.RequestFacts.of(prompt_ids=prompt, eos_token_id=EOS, vocabulary=_vocabulary()))
    assert request is not None and not request.failed
    return request


def test_resident_with_host_histories_and_from_the_token_window_where_the_template_fits() -> None:
    payload = [{"kind": "dry", "multiplier": 0.8}]  # the default breakers: single characters, no tails here
    template = _processor({**payload[0], "include_prompt": True}, []).template
    assert isinstance(template, DryTemplate) and template.cap == 2 + 158 and not template.tails
    assert template.singles == (3,)  # ':' alone holds a default breaker in VOCAB
    v1 = SlotBatch(num_slots=2, vocab_size=W, device="cpu", host_histories=True)
    assert v1.assign(0, _realize(payload, [1, 2]))
    (group,) = v1.groups.values()
    assert isinstance(group, DryGroup) and not group.from_window
    v2 = SlotBatch(num_slots=2, vocab_size=W, device="cpu", token_window=True)  # Model Runner V2
    assert v2.assign(0, _realize(payload, []))
    assert not v2.assign(1, _realize([{**payload[0], "sequence_breakers": ["<br>"]}], []))  # a two-token breaker
    assert not v2.assign(1, _realize([{**payload[0], "base": 1.0}], []))  # no clamp: repeats up to 2048 long
    assert v2.assign(1, _realize([{**payload[0], "base": 1.0, "penalty_last_n": 64}], []))  # ... unless the look-back bounds them
    assert not SlotBatch(num_slots=2, vocab_size=W, device="cpu").assign(0, _realize(payload, []))  # neither


def _payload(rng: random.Random) -> list[dict[str, Any]]:
    """``dry`` alone, or with a resident kind before or after it."""
    entry = _random_entry(rng)
    others: list[dict[str, Any]] = [{"kind": "banned_tokens", "token_ids": [rng.randrange(0, 10)]}, {"kind": "logit_bias", "bias": {"2": 2.0}}]
    chosen = rng.sample(others, rng.randint(0, 2))
    cut = rng.randint(0, len(chosen))
    return [*chosen[:cut], entry, *chosen[cut:]]


@pytest.mark.parametrize(("seed", "dtype"), [(0, torch.float32), (1, torch.float32), (2, torch.float16),
                                             (3, torch.bfloat16), (4, torch.float32)])
def test_the_resident_path_equals_the_host_path_through_batch_changes(seed: int, dtype: torch.dtype) -> None:
    """Requests enter slots and leave, laid out in a new row order every step, their live lists grown
    from a few ids (so repeats are common), with logits holding -inf, +inf, NaN and huge values;
    every step the resident rows equal their host-path twins' bit for bit."""
    rng = random.Random(seed)
    slots = 6
    batch = SlotBatch(num_slots=slots, vocab_size=W, device="cpu", host_histories=True)
    host: dict[int, sdk.GuardedRequest] = {}
    live: dict[int, list[int]] = {}
    alphabet: dict[int, int] = {}
    generator = torch.Generator().manual_seed(seed)
    lowered_rows = 0
    for step in range(60):
        if step == 0 or rng.random() < 0.25:  # a batch change
            for slot in range(slots):
                if slot not in host or rng.random() < 0.3:
                    payload = _payload(rng)
                    prompt = [rng.randrange(0, 10) for _ in range(rng.randint(0, 8))]
                    assert batch.assign(slot, _realize(payload, prompt))
                    host[slot], live[slot] = _realize(payload, prompt), []
                    alphabet[slot] = rng.randint(2, 10)
            batch.flush()
        order = rng.sample(sorted(host), rng.randint(1, len(host)))
        padded = [*order, -1]  # a row of a request without a payload
        batch.set_rows(np.array(padded))
        logits = (torch.randn(len(padded), W, generator=generator) * 4).to(dtype)
        logits[0, 0], logits[-1, 1] = float("-inf"), float("inf")
        if step % 5 == 0:
            logits[0, 1], logits[0, 2] = float("nan"), torch.finfo(dtype).min
        resident, hosted = logits.clone(), logits.clone()
        batch.apply(resident, EngineStep(histories=[*(live[s] for s in order), []]))
        sdk.apply_rows(hosted, list(range(len(order))), [host[s] for s in order], [live[s] for s in order])
        assert torch.equal(resident.isnan(), hosted.isnan()), step
        assert torch.equal(resident.nan_to_num(0.0), hosted.nan_to_num(0.0)), step
        assert torch.equal(resident[-1].nan_to_num(0.0), logits[-1].nan_to_num(0.0))
        lowered_rows += int((hosted[:-1].nan_to_num(0.0) < logits[:-1].nan_to_num(0.0)).any(1).sum())
        for slot in order:
            grow(rng, live[slot], alphabet[slot])
    assert lowered_rows >= 40  # the premise: rows met repeats at many steps


def test_resident_rows_lower_exactly_the_oracles_penalties() -> None:
    rng = random.Random(11)
    entries = [_random_entry(rng) for _ in range(4)]
    prompts = [[rng.randrange(0, 6) for _ in range(rng.randint(0, 6))] for _ in entries]
    batch = SlotBatch(num_slots=4, vocab_size=W, device="cpu", host_histories=True)
    for slot, (entry, prompt) in enumerate(zip(entries, prompts)):
        assert batch.assign(slot, _realize([entry], prompt))
    batch.flush()
    batch.set_rows(np.array([2, 0, 3, 1]))
    live: list[list[int]] = [[] for _ in entries]
    for _ in range(80):
        for grown in live:
            grow(rng, grown, 6)
        histories = [live[s] for s in (2, 0, 3, 1)]
        logits = torch.zeros(4, W, dtype=torch.float64)
        batch.apply(logits, EngineStep(histories=histories))
        for row, slot in enumerate((2, 0, 3, 1)):
            want = _expected(entries[slot], prompts[slot], histories[row])
            assert {t: -float(v) for t, v in enumerate(logits[row].tolist()) if v} == want


def test_a_row_whose_decision_raises_fails_its_request_alone_on_the_resident_path() -> None:
    payload = [{"kind": "dry", "multiplier": 1.0, "base": 2.0, "sequence_breakers": []}]
    batch = SlotBatch(num_slots=3, vocab_size=W, device="cpu", host_histories=True)
    requests = [_realize(payload, []) for _ in range(3)]
    for slot, request in enumerate(requests):
        assert batch.assign(slot, request)
    batch.flush()
    batch.set_rows(np.array([0, 1, 2]))
    histories: list[list[Any]] = [[0, 1, 2, 0, 1], [0, None, 0, 1], [3, 4, 5, 3, 4]]  # row 1's history breaks it
    logits = torch.zeros(3, W)
    batch.apply(logits, EngineStep(histories=histories))
    assert requests[1].failed and not requests[0].failed and not requests[2].failed
    assert logits[0].tolist() == [-1.0 if t == 2 else 0.0 for t in range(W)]
    assert logits[2].tolist() == [-1.0 if t == 5 else 0.0 for t in range(W)]
    assert logits[1].tolist() == [0.0 if t == EOS else float("-inf") for t in range(W)]  # fail-stopped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_amounts_are_packed_as_the_hosted_processor_converts_them(dtype: torch.dtype) -> None:
    from dynlogits.processors.dry_group import pack_amounts, packed_words

    rng = random.Random(5)
    amounts = [rng.choice([0.8, 1.75 ** rng.randint(0, 158), 100.0 * 100.0 ** rng.randint(0, 19), 1e300, 3.4028235e38,
                           3.40282356e38, rng.random() * 10]) for _ in range(37)]
    out = np.zeros(packed_words(len(amounts), dtype), dtype=np.int64)
    pack_amounts(amounts, dtype, out)
    got = torch.from_numpy(out).view(dtype)[: len(amounts)]
    want = torch.from_numpy(np.minimum(np.array(amounts), torch.finfo(dtype).max)).to(dtype)
    assert torch.equal(got, want) and torch.isfinite(got).all()


def test_a_trailing_plug_in_leaves_dry_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    """(A scoped dry: ``tests/processors/test_scoped_dry.py``.)"""
    monkeypatch.setenv("DYN_LOGITS_PYTHON_FACTORIES", "dynlogits.testing.faults:scale")
    python = {"kind": "python", "factory": "dynlogits.testing.faults:scale", "kwargs": {"scale": 0.5}}
    request = sdk.realize([{"kind": "dry", "multiplier": 1.0, "sequence_breakers": []}, python], vocab_size=W,
                          stop_token_id=EOS, facts=sdk.RequestFacts.of(prompt_ids=[], eos_token_id=EOS))
    assert request is not None and not request.failed
    leading, trailing = request.split()
    assert leading is not None and trailing is not None  # dry resident, the plug-in per row after it


@pytest.mark.parametrize("seed", range(3))
def test_decided_from_the_token_window_every_row_equals_the_hosted_path_breakers_included(seed: int) -> None:
    """Model Runner V2's layout (``SlotBatch(token_window=True)``, rows' tokens in a device matrix read
    through a ``TokenWindow``): over random entries with single-token breakers (``:``, ``c``), look-backs
    that slide, prompts counted or not, slots reused, every row equals its host-path twin's bit for bit."""
    from dynlogits.processors.window import TokenWindow

    rng = random.Random(seed)
    slots, max_len = 5, 128  # at most 8 + 20 + 60 tokens a request
    batch = SlotBatch(num_slots=slots, vocab_size=W, device="cpu", token_window=True)
    window = TokenWindow("cpu")
    tokens = torch.zeros(slots, max_len, dtype=torch.long)
    prompt_len = torch.zeros(slots, dtype=torch.long)
    host: dict[int, sdk.GuardedRequest] = {}
    state: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (prompt, output)
    lowered = 0
    for step in range(60):
        if step == 0 or rng.random() < 0.2:
            for slot in range(slots):
                if slot not in host or rng.random() < 0.3:
                    entry = {**_random_entry(rng), "sequence_breakers": rng.choice([[], [":"], [":", "c"], ['"', "*"]]),
                             "base": rng.choice([1.5, 1.75, 3.0]), "penalty_last_n": rng.choice([-1, 4, 16, 64])}
                    prompt = [rng.randrange(0, 6) for _ in range(rng.randint(1, 8))]
                    output = [rng.randrange(0, 6) for _ in range(rng.choice([0, 3, 20]))]
                    assert batch.assign(slot, _realize([entry], prompt))
                    host[slot], state[slot] = _realize([entry], prompt), (prompt, output)
            batch.flush()
        order = rng.sample(sorted(host), rng.randint(1, len(host)))
        batch.set_rows(np.array(order))
        for slot in order:
            prompt, output = state[slot]
            seq = [*prompt, *output]
            tokens[slot, : len(seq)] = torch.tensor(seq)
            prompt_len[slot] = len(prompt)
        pos = torch.tensor([len(state[s][0]) + len(state[s][1]) - 1 for s in order])
        logits = torch.randn(len(order), W) * 3
        logits[:, 7] = float("-inf")
        resident, hosted = logits.clone(), logits.clone()
        engine = EngineStep(pos=pos, pos_offset=torch.zeros(len(order), dtype=torch.long),
                            window=window.at(tokens, prompt_len, pos))
        batch.apply(resident, engine)
        sdk.apply_rows(hosted, list(range(len(order))), [host[s] for s in order], [state[s][1] for s in order])
        assert torch.equal(resident, hosted), step
        lowered += int((hosted < logits).any(1).sum())
        for slot in order:  # often the token that followed an earlier one: repeats are common
            seq = [*state[slot][0], *state[slot][1]]
            at = rng.randrange(len(seq))
            state[slot][1].append(seq[at + 1] if at + 1 < len(seq) and rng.random() < 0.7 else rng.randrange(0, 6))
    assert lowered >= 20  # the premise: rows met repeats at many steps
