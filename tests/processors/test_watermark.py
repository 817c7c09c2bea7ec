"""The ``watermark`` kind: its entry, its admission rule and its processor (the Gumbel-max draw with
vLLM's PRF, distortion-free, forced, greedy left alone, placeholders and repeated contexts left to
the engine), checked against vLLM 0.32's own watermarker and detector where they import."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch

from dynlogits.processors.base import RealizeContext, SamplingView
from dynlogits.processors.watermark import MAX_HISTORY, WatermarkProcessor, factory, truncate, watermark_draw
from dynlogits.processors.watermark_detect import detect
from dynlogits.processors.watermark_prf import gumbel_noise, uniform
from dynlogits.specs import SpecError, parse_entries
from dynlogits.specs.builtin.watermark import Watermark, WatermarkSpec
from dynlogits.specs.consistency import check_consistency
from dynlogits.specs.wire import decode_wire_payload

KEY = 0xC0FFEE_1234_5678
SECRET = 987_654_321_987_654_321


def _processor(temperature: float | None = 1.0, width: int = 4, key: int = KEY, **sampling: Any) -> WatermarkProcessor:
    entry = WatermarkSpec(key=key, context_width=width)
    return factory(entry, RealizeContext(1000, sampling=SamplingView(temperature=temperature, **sampling)))


def _forced(row: torch.Tensor) -> int:
    finite = torch.isfinite(row).nonzero().view(-1).tolist()
    assert len(finite) == 1 and row[finite[0]].item() == 0.0, finite
    return int(finite[0])


# -- the entry ---------------------------------------------------------------------------------------
def test_the_entry_defaults_to_vllms_scheme_and_width() -> None:
    (entry,) = parse_entries([{"kind": "watermark", "key": 5}])
    assert (entry.scheme, entry.key, entry.context_width) == ("gumbel", 5, 4)
    (wire,) = decode_wire_payload([{"kind": "watermark", "key": 2**64 - 1, "context_width": 32}])
    assert (wire.key, wire.context_width) == (2**64 - 1, 32)
    (fast,) = decode_wire_payload([{"kind": "watermark", "key": 5, "context_width": 3}])
    assert isinstance(fast, (Watermark, WatermarkSpec)) and fast.context_width == 3


@pytest.mark.parametrize(("entry", "message"), [
    ({"key": SECRET * 100}, "[0].key: must be <= 18446744073709551615"),
    ({"key": -SECRET}, "[0].key: must be >= 0"),
    ({"key": True}, "[0].key: must be an integer"),
    ({"key": 1, "context_width": 33}, "[0].context_width: must be <= 32"),
    ({"key": 1, "context_width": 0}, "[0].context_width: must be >= 1"),
    ({"key": 1, "scheme": "kgw"}, "[0].scheme: must be 'gumbel'"),
    ({"key": 1, "scope": "answer"}, "[0].scope: a watermark applies to every step of the output"),
    ({"context_width": 4}, "[0].key: "),
])
def test_a_bad_entry_is_refused_naming_the_field_and_never_quoting_the_key(entry: dict[str, Any], message: str) -> None:
    for decode in (lambda p: parse_entries(p, root="dynamo_logits"), decode_wire_payload):
        with pytest.raises(SpecError) as raised:
            decode([{"kind": "watermark", **entry}])
        assert message in str(raised.value)
        assert str(SECRET)[:9] not in str(raised.value)


def test_an_entry_after_the_watermark_is_refused_naming_both() -> None:
    entries = parse_entries([{"kind": "watermark", "key": SECRET}, {"kind": "banned_tokens", "token_ids": [3]}])
    with pytest.raises(SpecError) as raised:
        check_consistency(entries, root="dynamo_logits")
    text = str(raised.value)
    assert text.startswith("dynamo_logits[1]: comes after dynamo_logits[0] (watermark), which must be the last entry")
    assert str(SECRET) not in text
    with pytest.raises(SpecError, match=r"dynamo_logits\[1\]: comes after dynamo_logits\[0\] \(watermark\)"):
        check_consistency(parse_entries([{"kind": "watermark", "key": 1}, {"kind": "watermark", "key": 2}]),
                          root="dynamo_logits")
    # before it, any entry composes: the draw is made from what they leave
    check_consistency(parse_entries([{"kind": "banned_tokens", "token_ids": [3]},
                                     {"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 1},
                                     {"kind": "watermark", "key": 2}]), root="dynamo_logits")


# -- the draw ----------------------------------------------------------------------------------------
def test_the_draw_is_vllms_gumbel_watermarker_on_the_same_logits_and_context() -> None:
    watermarking = pytest.importorskip("vllm.v1.watermarking")
    rng = random.Random(3)
    marker = watermarking.GumbelWatermarker(KEY, 4)
    for _ in range(60):
        context = [rng.choice([-1, rng.randrange(1000)]) for _ in range(4)]
        logits = torch.randn(1, 1000) * 3
        temperature = rng.choice([1.0, 0.7, 1.6])
        theirs = int(marker.sample(logits / temperature, torch.tensor([context])).token_ids[0])
        ours = int(watermark_draw(logits[0], key=KEY, context=context, temperature=temperature))
        assert ours == theirs


def test_the_row_is_forced_to_the_draw_and_masks_are_never_undone() -> None:
    processor = _processor()
    history = [5, 6, 7, 8, 9]
    row = torch.randn(1000)
    allowed = torch.tensor([3, 17, 400])
    row_masked = torch.full((1000,), float("-inf"))
    row_masked[allowed] = row[allowed]
    expected = int(watermark_draw(row_masked, key=KEY, context=history[-4:], temperature=1.0))
    processor(history, row_masked)
    assert _forced(row_masked) == expected and expected in allowed.tolist()
    empty = torch.full((1000,), float("-inf"))
    processor(history, empty)  # nothing left: stays empty (the request fails as for any entry)
    assert not torch.isfinite(empty).any()


def test_the_sampled_distribution_is_the_models_at_its_temperature_with_top_k_top_p_min_p() -> None:
    """Over contexts the drawn token is distributed as vLLM samples: softmax(truncated logits / T).
    The draws of 20,000 distinct contexts at once, with the PRF's tensor form (bit-equal to the
    processor's host-state form, ``test_watermark_prf``); a few through the processor itself."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, -8.0])
    cases: list[dict[str, Any]] = [dict(temperature=1.0), dict(temperature=0.5), dict(temperature=2.0, top_k=3),
                                   dict(temperature=1.0, top_p=0.8), dict(temperature=1.0, min_p=0.2)]
    draws = 20_000
    contexts = torch.stack([torch.arange(draws) // 8191, torch.arange(draws) % 8191], dim=1)
    u = uniform(KEY, contexts, torch.arange(len(logits)))
    for case in cases:
        t = case["temperature"]
        kept = truncate(logits / t, top_k=case.get("top_k"), top_p=case.get("top_p"), min_p=case.get("min_p"))
        chosen = torch.argmax(kept + gumbel_noise(u), dim=-1)
        counts = torch.bincount(chosen, minlength=len(logits)).tolist()
        expected = torch.softmax(kept, -1).tolist()
        for seen, p in zip(counts, expected):
            sd = math.sqrt(draws * p * (1 - p)) + 1
            assert abs(seen - draws * p) <= 5 * sd, (case, counts, expected)
        proc = WatermarkProcessor(KEY, 2, **case)
        for i in range(0, draws, 997):  # the processor forces exactly that draw
            row = logits.clone()
            proc(contexts[i].tolist(), row)
            assert _forced(row) == int(chosen[i])


def test_truncation_is_vllms_min_p_then_top_k_top_p() -> None:
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        x = torch.randn(1, 500, generator=gen) * 2
        x[0, :5] = x[0, 5]  # ties
        k, p, m = 40, 0.7, 0.05
        probs = torch.softmax(x, -1)
        theirs = x.masked_fill(probs < probs.amax(-1, keepdim=True) * m, float("-inf"))
        theirs = ops.apply_top_k_top_p_pytorch(theirs.clone(), torch.tensor([k]), torch.tensor([p]))
        assert torch.equal(truncate(x[0], top_k=k, top_p=p, min_p=m), theirs[0])


@pytest.mark.parametrize("temperature", [None, 0.0, 1e-6])
def test_greedy_requests_are_left_as_they_are(temperature: float | None) -> None:
    row = torch.randn(1000)
    before = row.clone()
    _processor(temperature)([1, 2, 3, 4, 5], row)
    assert torch.equal(row, before)


def test_a_placeholder_in_the_context_is_never_taken_for_a_token() -> None:
    row = torch.randn(1000)
    before = row.clone()
    _processor()([1, 2, 3, 4, -1], row)  # vLLM's async placeholder in the newest slot
    assert torch.equal(row, before)  # left to the engine's sampler, not drawn with a wrong context
    _processor()([1, 2, 3, 4, 9], row)
    assert _forced(row) == int(watermark_draw(before, key=KEY, context=[2, 3, 4, 9], temperature=1.0))


def test_a_repeated_context_is_left_to_the_engine_as_vllm_leaves_it() -> None:
    processor = _processor(width=2)
    history = [1, 2, 3, 1, 2]  # the context (1, 2) came before (position 2)
    row = torch.randn(1000)
    before = row.clone()
    processor(history, row)
    assert torch.equal(row, before)
    processor([1, 2, 3, 1], row)  # (3, 1) is new
    assert torch.isfinite(row).sum() == 1


def test_the_repeat_window_is_vllms_max_history() -> None:
    processor = _processor(width=1)
    history = [7] + list(range(10, 10 + MAX_HISTORY)) + [7]  # (7,) last seen MAX_HISTORY + 1 positions back
    row = torch.randn(1000)
    processor(history, row)
    assert torch.isfinite(row).sum() == 1


def test_one_instance_serves_several_rows_in_any_order() -> None:
    shared = _processor()
    gen = torch.Generator().manual_seed(4)
    rng = random.Random(4)
    histories: list[list[int]] = [[], [], []]
    for _ in range(120):
        r = rng.randrange(3)
        if rng.random() < 0.1 and histories[r]:
            histories[r] = histories[r][: rng.randrange(len(histories[r]))]  # a preempted or rejected stretch
        row = torch.randn(1000, generator=gen)
        fresh_row = row.clone()
        shared(histories[r], row)
        _processor()(list(histories[r]), fresh_row)
        assert torch.equal(row, fresh_row)
        histories[r].append(int(torch.argmax(row)))


def test_generated_text_is_found_by_vllms_detector_and_ours_and_not_under_another_key() -> None:
    watermarking = pytest.importorskip("vllm.v1.watermarking")
    gen = torch.Generator().manual_seed(5)
    processor = _processor(temperature=1.0)
    out: list[int] = []
    for _ in range(160):
        row = torch.randn(1000, generator=gen)
        processor(out, row)
        out.append(_forced(row))
    theirs = watermarking.GumbelWatermarkDetector(KEY, 4, prf="philox").detect(out)
    ours = detect(out, key=KEY, context_width=4, vocab_size=1000)
    assert theirs.p_value <= 1e-4 and ours.p_value == theirs.p_value and ours.score == theirs.score
    assert not watermarking.GumbelWatermarkDetector(KEY + 1, 4, prf="philox").detect(out).is_watermarked


def test_the_key_is_not_in_the_processors_repr() -> None:
    assert str(SECRET) not in repr(_processor(key=SECRET)) and "key" not in repr(_processor(key=SECRET))


def test_no_host_sync_and_no_upload_on_the_cuda_model() -> None:
    from dynlogits.testing.cuda.simcuda import SimCuda

    processor = _processor(top_k=50, top_p=0.9, min_p=0.01)
    with SimCuda() as sim:
        row = sim.put(torch.randn(1000))
        processor([1, 2, 3, 4, 5, 6], row)
        processor([1, 2, 3, 4, 5, 6, 7], row)
    assert [str(s) for s in sim.syncs] == []
    assert int(torch.isfinite(sim.value(row)).sum()) == 1


def test_repeated_contexts_are_vllms_on_random_histories() -> None:
    """Which steps are left unmarked is vLLM's ``single_turn`` deduplication, compared with its own
    CPU reference (``repeated_context_mask``'s ``_repeated_context_mask_cpu``) on random histories."""
    watermark = pytest.importorskip("vllm.v1.worker.gpu.sample.watermark")
    rng = random.Random(11)
    for _ in range(150):
        width = rng.randint(1, 4)
        history = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        context = ([-1] * width + history)[len(history):]
        theirs = watermark._repeated_context_mask_cpu(
            torch.tensor([history + [0]]), torch.tensor([0]), torch.tensor([0]), torch.tensor([len(history)]),
            torch.tensor([context]), MAX_HISTORY)
        ours = _processor(width=width).context(history) is None
        assert ours == bool(theirs[0]), (width, history)


def test_draft_rows_and_rejected_drafts_are_followed_as_fresh_histories() -> None:
    """Model Runner V2's verify rows: the committed history, then each draft appended, one row per
    draft; a rejected draft rolls the history back. Each row's step is what a fresh processor does."""
    shared = _processor(width=2)
    rng = random.Random(8)
    gen = torch.Generator().manual_seed(8)
    committed: list[int] = []
    for _ in range(40):
        drafts = [rng.randrange(4) for _ in range(3)]
        for k in range(len(drafts) + 1):
            history = committed + drafts[:k]
            row = torch.randn(1000, generator=gen)
            fresh = row.clone()
            shared(history, row)
            _processor(width=2)(list(history), fresh)
            assert torch.equal(row, fresh), history
        committed += drafts[: rng.randrange(len(drafts) + 1)] + [rng.randrange(4)]


def test_neither_entry_model_shows_the_key_in_its_repr() -> None:
    """The key is the operator's secret: an entry logged or put in an error message never shows it."""
    key = 15713294082266031957
    spec = WatermarkSpec(key=key)
    (fast,) = decode_wire_payload([{"kind": "watermark", "key": key}])
    assert isinstance(fast, Watermark | WatermarkSpec)
    for shown in (repr(spec), str(spec), repr(fast), str(fast), repr([fast]), repr((spec,))):
        assert str(key) not in shown and "context_width=4" in shown.replace(": ", "=")
