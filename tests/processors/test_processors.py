"""Built-in processors: exact effect on a row, in place, position from the generated tokens."""

import math

import pytest
import torch

from dynlogits.processors import (
    AllowedTokensProcessor,
    BannedTokensProcessor,
    ForcedSequenceProcessor,
    LogitBiasProcessor,
    MinTokensProcessor,
    RealizeContext,
    ThinkingBudgetProcessor,
)
from dynlogits.processors.registry import BUILTIN_FACTORIES
from dynlogits.specs import WIRE_KINDS, decode_wire_payload

V = 50
NEG = -math.inf


def row(dtype=torch.float32) -> torch.Tensor:
    return torch.arange(V, dtype=dtype) / 10


def apply(proc, ids, dtype=torch.float32) -> torch.Tensor:
    r = row(dtype)
    ptr = r.data_ptr()
    assert proc(ids, r) is None
    assert r.data_ptr() == ptr, "processors must modify the row in place"
    return r


def only(r: torch.Tensor) -> int:
    finite = torch.isfinite(r).nonzero().flatten().tolist()
    assert len(finite) == 1, finite
    return finite[0]


def test_forced_sequence_forces_each_token_then_eos_forever():
    p = ForcedSequenceProcessor((7, 8, 9), eos_token_id=1)
    assert [only(apply(p, [0] * n)) for n in range(6)] == [7, 8, 9, 1, 1, 1]
    assert apply(p, [])[7] == 0.0


def test_forced_sequence_resumes_from_history_after_preemption():
    p = ForcedSequenceProcessor((7, 8, 9), eos_token_id=1)
    only(apply(p, [7, 8]))
    assert only(apply(p, [7])) == 8  # recomputed from a shorter history
    assert only(apply(p, [7])) == 8  # idempotent at the same step


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_banned_tokens_are_minus_inf_and_the_rest_untouched(dtype):
    r = apply(BannedTokensProcessor((3, 40, 3)), [], dtype)
    expected = row(dtype)
    expected[[3, 40]] = NEG
    assert torch.equal(r, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_allowed_tokens_keep_their_values_and_eos(dtype):
    r = apply(AllowedTokensProcessor((5, 6), eos_token_id=1), [1, 2], dtype)
    assert torch.isfinite(r).nonzero().flatten().tolist() == [1, 5, 6]
    assert torch.equal(r[[1, 5, 6]], row(dtype)[[1, 5, 6]])


def test_allowed_tokens_without_eos_allow_only_the_list():
    assert torch.isfinite(apply(AllowedTokensProcessor((0,)), [])).nonzero().flatten().tolist() == [0]


def test_logit_bias_adds_to_the_listed_ids():
    r = apply(LogitBiasProcessor({2: 1.5, 30: -3.0}), [])
    expected = row()
    expected[2] += 1.5
    expected[30] -= 3.0
    assert torch.allclose(r, expected)


def test_min_tokens_suppresses_stop_ids_only_until_the_minimum():
    p = MinTokensProcessor(2, (1, 4))
    assert apply(p, [])[1] == NEG and apply(p, [9])[4] == NEG
    assert torch.equal(apply(p, [9, 9]), row())


START, END = (10, 11), (20, 21)


def thinking(budget: int) -> ThinkingBudgetProcessor:
    return ThinkingBudgetProcessor(START, END, budget)


def test_thinking_budget_leaves_rows_alone_outside_a_span_and_under_budget():
    p = thinking(3)
    assert torch.equal(apply(p, [5, 10]), row())  # start not complete
    assert torch.equal(apply(p, [5, 10, 11, 7, 7]), row())  # 2 tokens of 3 used


def test_thinking_budget_forces_the_whole_end_sequence_once_spent():
    p = thinking(2)
    ids = [10, 11, 7, 7]
    for expected in END:
        tok = only(apply(p, ids))
        assert tok == expected
        ids.append(tok)
    assert torch.equal(apply(p, ids), row())  # span closed: free again


def test_thinking_budget_continues_an_end_sequence_the_model_began():
    assert only(apply(thinking(2), [10, 11, 7, 20])) == 21


def test_thinking_budget_natural_end_closes_the_span_and_a_new_span_gets_a_fresh_budget():
    p = thinking(2)
    ids = [10, 11, 7, 20, 21, 5]
    assert torch.equal(apply(p, ids), row())
    ids += [10, 11, 7]
    assert torch.equal(apply(p, ids), row())  # 1 of 2 in the new span
    ids += [7]
    assert only(apply(p, ids)) == 20


def test_thinking_budget_zero_closes_every_span_at_once():
    assert only(apply(thinking(0), [3, 10, 11])) == 20


def test_thinking_budget_rescans_when_the_history_changes():
    p = thinking(1)
    assert only(apply(p, [10, 11, 7])) == 20
    assert torch.equal(apply(p, [10, 12, 7]), row())  # same length, different tokens: no span
    assert torch.equal(apply(p, [10]), row())  # shorter history


def test_thinking_budget_incremental_scan_matches_a_fresh_scan():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(9, 23, (300,), generator=gen).tolist()
    incremental = thinking(3)
    for n in range(len(ids) + 1):
        a = apply(incremental, ids[:n])
        b = apply(thinking(3), ids[:n])
        assert torch.equal(a, b), n


def test_thinking_budget_counts_the_tokens_of_a_span_the_prompt_left_open():
    """DeepSeek-R1 style: the chat template ends the prompt inside a span; its tokens after the start
    tag count against the budget, as vLLM's ``thinking_token_budget`` counts them."""
    p = ThinkingBudgetProcessor(START, END, 3, prompt=[5, 10, 11, 7, 7])  # 2 thinking tokens in the prompt
    assert torch.equal(apply(p, []), row())
    assert only(apply(p, [8])) == 20
    spent = ThinkingBudgetProcessor(START, END, 1, prompt=[10, 11, 7, 7])  # over budget in the prompt already
    assert only(apply(spent, [])) == 20


def test_thinking_budget_sees_delimiters_that_straddle_the_prompts_end():
    opened = ThinkingBudgetProcessor(START, END, 1, prompt=[5, 10])  # [10 | 11] opens the span
    assert torch.equal(apply(opened, [11]), row())
    assert only(apply(opened, [11, 7])) == 20
    ending = ThinkingBudgetProcessor(START, END, 2, prompt=[10, 11, 7, 20])  # the prompt began the end sequence
    assert only(apply(ending, [])) == 21


def test_thinking_budget_ignores_a_span_the_prompt_closed():
    p = ThinkingBudgetProcessor(START, END, 0, prompt=[10, 11, 7, 20, 21, 5])
    assert torch.equal(apply(p, [6, 6]), row())


def test_thinking_budget_without_delimiters_takes_the_requests_reasoning_delimiters():
    entry = decode_wire_payload([{"kind": "reasoning", "start_token_ids": list(START), "end_token_ids": list(END)},
                                 {"kind": "thinking_budget", "budget": 1}])[1]
    ctx = RealizeContext(vocab_size=V, prompt_ids=(3, 10, 11), reasoning=(START, END))
    assert only(apply(BUILTIN_FACTORIES["thinking_budget"](entry, ctx), [7])) == 20
    with pytest.raises(ValueError, match="no delimiters of its own .* and the request has no reasoning delimiters"):
        BUILTIN_FACTORIES["thinking_budget"](entry, RealizeContext(vocab_size=V))


def _entries():
    """One entry of each built-in kind (decoded one by one: together they contradict each other)."""
    return [
        decode_wire_payload([entry])[0]
        for entry in (
            {"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 1},
            {"kind": "banned_tokens", "token_ids": [3]},
            {"kind": "allowed_tokens", "token_ids": [4]},
            {"kind": "logit_bias", "bias": {"2": 1.0}},
            {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [1]},
            {"kind": "banned_phrases", "phrases": [[10, 12], [13]]},
            {"kind": "multiple_choice", "choices": [[10, 12], [14]], "eos_token_id": 1},
            {"kind": "trigger", "trigger_token_ids": [10], "phrase_token_ids": [12, 13]},
            {"kind": "deadline", "seconds": 60.0},
            {"kind": "prompt_tokens", "mode": "boost"},
            {"kind": "dry", "multiplier": 0.8, "sequence_breakers": []},
            {"kind": "no_repeat_ngram", "size": 2},
            {"kind": "watermark", "key": 7},  # greedy here (no temperature): its draw is the sampler's own O(vocab) work
            {"kind": "thinking_budget", "start_token_ids": [10], "end_token_ids": [11], "budget": 1},
        )
    ]


def test_every_wire_kind_but_python_and_reasoning_has_a_builtin_factory():
    assert set(BUILTIN_FACTORIES) == WIRE_KINDS - {"python", "reasoning"}


def test_factories_build_fresh_processors_per_request():
    ctx = RealizeContext(vocab_size=V, prompt_ids=(3, 4), stop_token_ids=(1,))
    for entry in _entries():
        a, b = BUILTIN_FACTORIES[entry.kind](entry, ctx), BUILTIN_FACTORIES[entry.kind](entry, ctx)
        assert a is not b
    p1 = BUILTIN_FACTORIES["thinking_budget"](_entries()[-1], ctx)
    p2 = BUILTIN_FACTORIES["thinking_budget"](_entries()[-1], ctx)
    only(apply(p1, [10, 7]))
    assert p2.scanner._scanned == 0  # scanning one request left the other untouched


def _largest_allocation(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def test_the_allocation_probe_sees_a_vocab_sized_allocation():
    r = torch.zeros(100_000)
    assert _largest_allocation(lambda: r.add_(torch.full_like(r, 1.0))) >= r.numel() * 4


@pytest.mark.parametrize("kind", sorted(WIRE_KINDS - {"python", "reasoning"}))
def test_no_processor_allocates_a_vocab_sized_tensor_per_step(kind):
    vocab = 100_000
    (entry,) = [e for e in _entries() if e.kind == kind]
    proc = BUILTIN_FACTORIES[kind](entry, RealizeContext(vocab_size=vocab, prompt_ids=(3, 4), stop_token_ids=(1,)))
    r = torch.zeros(vocab)
    proc([10], r)  # the first call builds the small cached index tensors
    assert _largest_allocation(lambda: proc([10], r)) < 4096
