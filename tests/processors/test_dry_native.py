"""``dry``'s native host step (``dry_native``): on random histories grown step by step as an engine
grows them (repeats, rewrites of the newest tokens, placeholders, jumps, rows that move or change
list), every row it steps gets exactly the ids and amounts of its processor's Python step, with any
look-back, cap, clamp and single-token breakers; rows it cannot step go to the Python processors;
switched off, or broken, the Python processors decide every row. Every test runs with the rows'
lists read by the C reader (``dry_read``) and by Python. Needs a C compiler (``cc``)."""

from __future__ import annotations

import logging
import random
import shutil
from typing import Any

import numpy as np
import pytest
import torch
from dry_histories import grow

from dynlogits import sdk
from dynlogits.processors import dry_native
from dynlogits.processors.base import RealizeContext
from dynlogits.processors.dry import TAIL_CHECKED, DryProcessor, factory
from dynlogits.processors.dry_group import DryGroup
from dynlogits.processors.dry_native import NativeStep
from dynlogits.processors.vocabulary import Vocabulary
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs.builtin.dry import DrySpec

#: ``:`` (3) breaks alone; ``<`` (4) breaks when ``br>`` (5) follows; 16 ids
VOCAB = ("a", "b", "c", ":", "<", "br>", "y", "<br>", "d", "e", "f", "g", "h", "i", "j", "k")
W = len(VOCAB)
EOS = 15
BREAKER_SETS = [[], ["\n", ":", '"', "*"], [":"], [":", "c"], ["<br>"]]

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")


@pytest.fixture(scope="module")
def fn() -> Any:
    built = dry_native.library(wait=True)
    assert built is not None, "the native step did not build with this machine's cc"
    return built


@pytest.fixture(autouse=True, params=["c_reader", "python_reader"])
def reader(request: pytest.FixtureRequest, fn: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The lists read by ``dry_read`` (it must have loaded and passed its probe here) or by Python."""
    if request.param == "python_reader":
        monkeypatch.setattr(dry_native, "reader", lambda: None)
        return None
    read = dry_native.reader()
    assert read is not None, "the C reader of the rows' lists did not load here"
    return read


def _entry(rng: random.Random) -> dict[str, Any]:
    return {"kind": "dry", "multiplier": rng.choice([0.8, 3.0]), "base": rng.choice([1.0, 1.75, 3.0, 100.0]),
            "allowed_length": rng.randint(1, 4), "penalty_last_n": rng.choice([-1, 4, 16, 64]),
            "sequence_breakers": rng.choice(BREAKER_SETS), "include_prompt": rng.random() < 0.7}


def _processor(entry: dict[str, Any], prompt: list[int]) -> DryProcessor:
    return factory(DrySpec.model_validate(entry),
                   RealizeContext(W, prompt_ids=tuple(prompt), tokenizer_vocabulary=Vocabulary(lambda: VOCAB)))


def _grow(rng: random.Random, live: list[int], alphabet: int) -> list[int]:
    """One engine step (``dry_histories.grow``: tokens, rewrites of the newest ones, placeholders,
    jumps), or now and then the same tokens and one more in another list object."""
    if rng.random() < 0.02:
        return [*live, rng.randrange(alphabet)]
    grow(rng, live, alphabet)
    return live


def _python(processor: DryProcessor, history: list[int], base: int) -> dict[int, float]:
    flat: list[int] = []
    amounts: list[float] = []
    processor.penalize_into(history, W, base, flat, amounts)
    return dict(zip(flat, amounts))


@pytest.mark.parametrize("seed", range(8))
def test_every_row_gets_its_processors_ids_and_amounts_whether_stepped_natively_or_not(fn: Any, seed: int) -> None:
    rng = random.Random(seed)
    rows = 12
    entries = [_entry(rng) for _ in range(rows)]
    alphabets = [rng.randint(2, W) for _ in range(rows)]
    prompts = [[rng.randrange(a) for _ in range(rng.randint(0, 12))] for a in alphabets]
    native = [_processor(e, p) for e, p in zip(entries, prompts)]
    twins = [_processor(e, p) for e, p in zip(entries, prompts)]
    live: list[list[int]] = [[] for _ in range(rows)]
    order = list(range(rows))
    step_of: NativeStep | None = None
    stepped = decided = 0
    for step in range(150):
        if step % 37 == 0:  # the rows move (a new layout): each processor keeps its window
            rng.shuffle(order)
            step_of = None
        live = [_grow(rng, h, a) for h, a in zip(live, alphabets)]
        histories = [live[r] for r in order]
        if step_of is None:
            step_of = NativeStep(fn, [(row, r, native[r]) for row, r in enumerate(order)], W)
        left, hits = step_of.decide(histories)
        got = dict(zip(*hits.lists()))
        stepped += len(order) - len(left)
        for row, _, processor in left:
            got.update(_python(processor, histories[row], row * W))
        want: dict[int, float] = {}
        for row, r in enumerate(order):
            want.update(_python(twins[r], histories[row], row * W))
        assert got == want, (seed, step)
        decided += sum(1 for _ in want)
    steppable = sum(p.native_params() is not None for p in native)  # not multi-token breakers
    assert steppable >= 3 and stepped >= 0.6 * 150 * steppable  # the premise: most of their steps ran natively
    assert decided >= 100  # ... and penalized ids


def test_a_loop_longer_than_the_look_back_slides_its_window_exactly(fn: Any) -> None:
    entry = {"kind": "dry", "multiplier": 1.0, "base": 1.75, "allowed_length": 2, "penalty_last_n": 64,
             "sequence_breakers": [":"], "include_prompt": True}
    processor, twin = _processor(entry, [0, 1, 2]), _processor(entry, [0, 1, 2])
    live: list[int] = []
    step_of = NativeStep(fn, [(0, 0, processor)], W)
    loop = [0, 1, 2, 6, 8, 9, 3, 1, 2]
    for step in range(1000):  # the buffers grow to 256 tokens, then the window moves back to their start
        live.append(loop[step % len(loop)] if step % 53 else 10)
        left, hits = step_of.decide([live])
        assert not left
        assert dict(zip(*hits.lists())) == _python(twin, live, 0), step
    assert len(processor.native_row.tok) == 256  # four times the look-back, whatever the history's length


def test_it_compares_as_many_earlier_tokens_as_the_python_processors() -> None:
    assert dry_native.TAIL == TAIL_CHECKED


def test_multi_token_breakers_stay_on_the_python_processor(fn: Any) -> None:
    processor = _processor({"kind": "dry", "multiplier": 0.8, "sequence_breakers": ["<br>"]}, [])
    assert processor.native_params() is None
    step_of = NativeStep(fn, [(0, 0, processor)], W)
    assert step_of.decide([[1, 2, 1, 2]])[0] == [(0, 0, processor)]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=W, stop_token_id=EOS,
                          facts=sdk.RequestFacts.of(prompt_ids=prompt, eos_token_id=EOS,
                                                    vocabulary=Vocabulary(lambda: VOCAB)))
    assert request is not None and not request.failed
    return request


def _run_batch(seed: int) -> tuple[list[torch.Tensor], SlotBatch]:
    """Four requests on a ``SlotBatch`` given host histories (the V1 runner), 40 steps; each step's logits."""
    rng = random.Random(seed)
    batch = SlotBatch(num_slots=4, vocab_size=W, device="cpu", host_histories=True)
    for slot in range(4):
        assert batch.assign(slot, _realize([_entry(rng)], [rng.randrange(6) for _ in range(4)]))
    batch.flush()
    batch.set_rows(np.array([2, 0, 3, 1]))
    live: list[list[int]] = [[] for _ in range(4)]
    out = []
    for _ in range(40):
        for h in live:
            h.append(rng.randrange(6) if rng.random() < 0.3 or len(h) < 2 else h[rng.randrange(len(h) - 1) + 1])
        logits = torch.zeros(4, W)
        batch.apply(logits, EngineStep(histories=[live[s] for s in (2, 0, 3, 1)]))
        out.append(logits)
    return out, batch


def test_switched_off_or_broken_the_python_processors_decide_every_row(fn: Any, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    native, batch = _run_batch(3)
    (group,) = batch.groups.values()
    assert isinstance(group, DryGroup) and group._cache.get("native") is not None  # the premise: it ran natively
    monkeypatch.setenv(dry_native.ENV_SWITCH, "0")
    dry_native.reset()
    try:
        assert dry_native.library(wait=True) is None
        off, batch = _run_batch(3)
        (group,) = batch.groups.values()
        assert group._cache.get("native") is None
        assert all(torch.equal(a, b) for a, b in zip(native, off))
        monkeypatch.delenv(dry_native.ENV_SWITCH)
        dry_native.reset()
        assert dry_native.library(wait=True) is not None

        def broken(self: NativeStep, histories: Any) -> Any:
            raise RuntimeError("planted")

        monkeypatch.setattr(NativeStep, "decide", broken)
        with caplog.at_level(logging.ERROR, logger="dynlogits.processors.dry"):
            failed, batch = _run_batch(3)
        failures = [r for r in caplog.records if "native host step failed" in r.getMessage()]
        assert len(failures) == 1  # once: then the Python processors for good
        assert all(torch.equal(a, b) for a, b in zip(native, failed))
    finally:
        dry_native.reset()
        dry_native.library(wait=True)



def test_a_processor_deciding_two_rows_stays_on_the_python_processor(fn: Any) -> None:
    """A processor keeps one window: were it to decide two rows of a layout, both go to Python."""
    entry = {"kind": "dry", "multiplier": 1.0, "base": 1.75, "allowed_length": 2, "penalty_last_n": 64,
             "sequence_breakers": [], "include_prompt": True}
    shared, alone = _processor(entry, [0, 1]), _processor(entry, [0, 1])
    step_of = NativeStep(fn, [(0, 0, shared), (1, 0, shared), (2, 1, alone)], W)
    histories = [[1, 2, 1, 2], [2, 1, 2, 1, 2], [1, 2, 1, 2]]
    left, hits = step_of.decide(histories)
    assert left == [(0, 0, shared), (1, 0, shared)]
    assert dict(zip(*hits.lists())) == _python(_processor(entry, [0, 1]), histories[2], 2 * W)
    assert hits.n  # the premise: the row stepped natively penalizes something
