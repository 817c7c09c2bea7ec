"""``dynlogits.sdk.plans.apply_plans``: the batched path equals per-row application, with a number
of tensor ops that does not grow with the rows and no vocab-sized allocation."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from torch_counting import OpCounter

from dynlogits.sdk.plans import apply_plans
from dynlogits.sdk.realization import build_request_processor
from dynlogits.specs import SpecError, decode_wire_payload

V = 64
EOS = 1


def random_payload(rng: random.Random) -> list[dict]:
    """A random chain of every built-in kind, in random order and number."""
    ids = lambda k: rng.sample(range(V), k)  # noqa: E731
    makers = [
        lambda: {"kind": "forced_sequence", "token_ids": ids(rng.randint(1, 5)), "eos_token_id": EOS},
        lambda: {"kind": "banned_tokens", "token_ids": ids(rng.randint(1, 6))},
        lambda: {"kind": "allowed_tokens", "token_ids": ids(rng.randint(1, 6)), "eos_token_id": rng.choice([EOS, None])},
        lambda: {"kind": "logit_bias", "bias": {str(i): rng.uniform(-5, 5) for i in ids(rng.randint(1, 6))}},
        lambda: {"kind": "min_tokens", "min_tokens": rng.randint(1, 4), "stop_token_ids": [EOS]},
        lambda: {"kind": "thinking_budget", "start_token_ids": ids(1), "end_token_ids": ids(2), "budget": rng.randint(0, 3)},
    ]
    while True:  # payloads whose entries contradict each other are refused at admission: draw again
        payload = [rng.choice(makers)() for _ in range(rng.randint(1, 4))]
        for entry in payload:
            if entry.get("eos_token_id", 0) is None:
                del entry["eos_token_id"]
        try:
            decode_wire_payload(payload, vocab_size=V)
        except SpecError:
            continue
        return payload


class AddOne:
    """An opaque (python-kind style) processor: no ``row_op``, called on its row."""

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
        logits += 1.0


def requests_and_histories(seed: int, n: int) -> tuple[list, list[list[int]]]:
    rng = random.Random(seed)
    requests, histories = [], []
    for _ in range(n):
        req = build_request_processor(random_payload(rng), vocab_size=V)
        if rng.random() < 0.2:
            req.processors = (*req.processors, AddOne())
        requests.append(req)
        histories.append([rng.randrange(V) for _ in range(rng.randint(0, 6))])
    return requests, histories


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(40))
def test_batched_application_equals_applying_each_row_on_its_own(seed: int, dtype: torch.dtype) -> None:
    rng = random.Random(1000 + seed)
    n = rng.randint(1, 12)
    logits = torch.randn(n + 3, V, generator=torch.Generator().manual_seed(seed)).to(dtype)
    rows = rng.sample(range(n + 3), n)  # some rows belong to requests without processors
    expected = logits.clone()
    reqs_a, hist = requests_and_histories(seed, n)
    for row, req, h in zip(rows, reqs_a, hist):
        req(h, expected[row])
    reqs_b, _ = requests_and_histories(seed, n)  # fresh processors: thinking_budget keeps scan state

    apply_plans(logits, rows, [r.plan(h) for r, h in zip(reqs_b, hist)], hist)

    assert torch.equal(logits, expected)



def _count_ops(n_rows: int) -> int:
    payload = [{"kind": "banned_tokens", "token_ids": [3, 4]}, {"kind": "forced_sequence", "token_ids": [5, 6],
                                                                "eos_token_id": EOS}]
    reqs = [build_request_processor(payload, vocab_size=V) for _ in range(n_rows)]
    logits = torch.zeros(n_rows, V)
    hist = [[5]] * n_rows
    plans = [r.plan(h) for r, h in zip(reqs, hist)]
    apply_plans(logits, range(n_rows), plans, hist)  # warm the per-request index caches
    with OpCounter() as counter:
        apply_plans(logits, range(n_rows), plans, hist)
    assert torch.isfinite(logits).sum(dim=1).tolist() == [1] * n_rows
    return counter.ops


def test_tensor_ops_per_step_do_not_grow_with_the_rows() -> None:
    assert _count_ops(64) == _count_ops(2)


def test_a_raising_opaque_step_is_reported_and_the_other_rows_are_applied() -> None:
    class Boom:
        def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
            raise RuntimeError("boom")

    logits = torch.zeros(3, V)
    ok = build_request_processor([{"kind": "banned_tokens", "token_ids": [7]}], vocab_size=V)
    bad = build_request_processor([{"kind": "banned_tokens", "token_ids": [7]}], vocab_size=V)
    bad.processors = (Boom(), *bad.processors)
    errors: list[tuple[int, str]] = []
    apply_plans(logits, [0, 2], [ok.plan([]), bad.plan([])], [[], []],
                on_error=lambda i, exc: errors.append((i, str(exc))))
    assert errors == [(1, "boom")]
    assert logits[0, 7] == float("-inf") and torch.isfinite(logits[2]).all()  # the rest of a failed plan is skipped
    with pytest.raises(RuntimeError, match="boom"):
        apply_plans(logits, [2], [bad.plan([])], [[]])


def test_the_batched_path_allocates_nothing_vocab_sized() -> None:
    from torch.profiler import ProfilerActivity, profile

    vocab = 100_000
    payload = [{"kind": "allowed_tokens", "token_ids": [3, 4], "eos_token_id": EOS}, {"kind": "logit_bias", "bias": {"3": 1.0}},
               {"kind": "banned_tokens", "token_ids": [4]}, {"kind": "forced_sequence", "token_ids": [3],
                                                             "eos_token_id": EOS}]
    reqs = [build_request_processor(payload[i % 4:] or payload, vocab_size=vocab) for i in range(8)]
    logits = torch.zeros(8, vocab)
    hist = [[]] * 8
    apply_plans(logits, range(8), [r.plan(h) for r, h in zip(reqs, hist)], hist)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        apply_plans(logits, range(8), [r.plan(h) for r, h in zip(reqs, hist)], hist)
    assert max((e.cpu_memory_usage for e in prof.events()), default=0) < 4096


def test_a_row_op_that_is_not_a_row_op_is_refused_by_name() -> None:
    class Odd:
        def row_op(self, input_ids: Sequence[int]) -> str:
            return "not an op"

        def __call__(self, input_ids: Sequence[int], logits: torch.Tensor) -> None:
            pass

    req = build_request_processor([{"kind": "banned_tokens", "token_ids": [7]}], vocab_size=V)
    req.processors = (Odd(),)
    with pytest.raises(TypeError, match=r"Odd\.row_op returned str, not a RowOp or None"):
        req.plan([])
