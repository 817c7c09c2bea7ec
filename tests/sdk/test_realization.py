"""Engine-side realization: payload -> fresh, validated per-request processors."""

import math
from typing import Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict

from dynlogits import sdk
from dynlogits.processors import RealizeContext
from dynlogits.processors.registry import PYTHON_FACTORIES_ENV
from dynlogits.sdk.realization import build_request_processor, decode_payload, validate
from dynlogits.specs import SpecError, kinds
from dynlogits.specs.kinds import ProcessorKind, register_kind

VOCAB = 32
FORCED = [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 1}]


def test_absent_or_empty_payload_realizes_nothing():
    assert build_request_processor(None, vocab_size=VOCAB) is None
    assert build_request_processor([], vocab_size=VOCAB) is None


def test_processors_are_fresh_per_request():
    a = build_request_processor(FORCED, vocab_size=VOCAB)
    b = build_request_processor(FORCED, vocab_size=VOCAB)
    assert a.processors[0] is not b.processors[0]


def test_entries_apply_in_payload_order_in_place():
    proc = build_request_processor(
        [{"kind": "logit_bias", "bias": {"3": 100.0}}, {"kind": "banned_tokens", "token_ids": [3]}], vocab_size=VOCAB
    )
    row = torch.zeros(VOCAB)
    ptr = row.data_ptr()
    proc([], row)
    assert row.data_ptr() == ptr and row[3] == -math.inf and row[4] == 0


def test_forced_payload_forces_each_token_then_eos():
    proc = build_request_processor(FORCED, vocab_size=VOCAB)
    generated: list[int] = []
    for _ in range(3):
        row = torch.randn(VOCAB)
        proc(generated, row)
        generated.append(int(row.argmax()))
    assert generated == [5, 6, 1]


def test_ids_beyond_the_logits_width_fail_before_realization():
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.eos_token_id: must be < vocab size 32"):
        build_request_processor([{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 40}], vocab_size=VOCAB)
    validate([{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 40}])  # vocab unknown: fine


def test_python_kind_needs_the_workers_allow_list(monkeypatch):
    payload = [{"kind": "python", "factory": "test_realization:make_zeroer", "kwargs": {"token_id": 2}}]
    monkeypatch.delenv(PYTHON_FACTORIES_ENV, raising=False)
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]\.factory: factory 'test_realization:make_zeroer' is not allow-listed"):
        build_request_processor(payload, vocab_size=VOCAB)
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, "other:thing, test_realization:make_zeroer")
    proc = build_request_processor(payload, vocab_size=VOCAB)
    row = torch.ones(VOCAB)
    proc([], row)
    assert row[2] == 0 and row.sum() == VOCAB - 1


def test_a_failing_factory_fails_only_its_request_with_a_named_error(monkeypatch):
    monkeypatch.setenv(PYTHON_FACTORIES_ENV, "test_realization:make_zeroer")
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]: could not realize kind 'python': TypeError"):
        build_request_processor([{"kind": "python", "factory": "test_realization:make_zeroer", "kwargs": {"nope": 1}}], vocab_size=VOCAB)


class _ScaleSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["scale"] = "scale"
    factor: float


class _Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, input_ids, logits) -> None:
        logits.mul_(self.factor)


def test_third_party_kind_is_validated_by_its_model_and_realized(monkeypatch):
    monkeypatch.setattr(kinds, "_registered", {})
    register_kind(ProcessorKind("scale", _ScaleSpec, lambda entry, ctx: _Scale(entry.factor)))
    proc = build_request_processor([{"kind": "banned_tokens", "token_ids": [0]}, {"kind": "scale", "factor": 2.0}], vocab_size=VOCAB)
    row = torch.ones(VOCAB)
    proc([], row)
    assert row[0] == -math.inf and row[1] == 2.0
    with pytest.raises(SpecError) as info:  # every problem at once, built-in or not
        decode_payload([{"kind": "banned_tokens", "token_ids": [-1]}, {"kind": "scale", "factor": "x", "extra": 1}])
    assert [str(p) for p in info.value.problems] == [
        "dynamo_logits[0].token_ids[0]: must be >= 0", "dynamo_logits[1].factor: must be a number",
        "dynamo_logits[1].extra: unknown field"]


def test_a_string_factory_is_imported_when_realized_and_its_failure_fails_the_request(monkeypatch):
    monkeypatch.setattr(kinds, "_registered", {})
    register_kind(ProcessorKind("scale", _ScaleSpec, "test_realization:make_scale"))
    proc = build_request_processor([{"kind": "scale", "factor": 3.0}], vocab_size=VOCAB)
    row = torch.ones(VOCAB)
    proc([], row)
    assert row[5] == 3.0
    register_kind(ProcessorKind("scale", _ScaleSpec, "test_realization:no_such_factory"))
    with pytest.raises(SpecError, match=r"dynamo_logits\[0\]: could not realize kind 'scale': AttributeError"):
        build_request_processor([{"kind": "scale", "factor": 3.0}], vocab_size=VOCAB)


def make_scale(entry, ctx: RealizeContext) -> _Scale:
    """The import-string factory of the ``scale`` kind in these tests."""
    return _Scale(entry.factor)


def test_builtin_kinds_cannot_be_replaced():
    for name in ("forced_sequence", "forced_text", "python"):
        with pytest.raises(ValueError, match="built in"):
            register_kind(ProcessorKind(name, _ScaleSpec, lambda e, c: _Scale(1.0)))


def make_zeroer(token_id: int):
    """A processor factory for the ``python`` kind tests."""

    def zero(input_ids, logits: torch.Tensor) -> None:
        logits[token_id] = 0.0

    return zero


def test_realize_context_carries_the_logits_width():
    assert RealizeContext(vocab_size=7).vocab_size == 7


def test_realization_reuses_what_admission_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A payload validated at admission and realized in the same process is decoded once; each
    realization still checks the width and gets fresh processors."""
    from dynlogits.sdk import realization

    calls: list[object] = []
    real = realization.decode_entries
    monkeypatch.setattr(realization, "decode_entries", lambda payload, **kw: (calls.append(payload), real(payload, **kw))[1])
    monkeypatch.setattr(realization, "_decoded_memo", realization._decoded_memo.emptied())
    monkeypatch.setattr(realization, "_checked_memo", realization._checked_memo.emptied())
    payload = [{"kind": "forced_sequence", "token_ids": [5, 6, 61], "eos_token_id": 1}]
    sdk.validate(payload)
    first = sdk.realize(payload, vocab_size=64, stop_token_id=1)
    second = sdk.realize([dict(payload[0])], vocab_size=64, stop_token_id=1)  # same content, another list
    assert len(calls) == 1
    assert first is not None and second is not None and first.processor is not second.processor
    narrow = sdk.realize(payload, vocab_size=32, stop_token_id=1)  # id 61 is beyond this width
    assert narrow is not None and narrow.failed and "vocab size 32" in (narrow.error or "")


def test_a_payload_is_checked_once_per_width_and_a_refused_one_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The width and consistency checks (``finish_entries``) of a payload that passed are kept per
    logits width; one they refuse runs again on every call."""
    from dynlogits.sdk import realization

    checked: list[int | None] = []
    real = realization.finish_entries
    monkeypatch.setattr(realization, "finish_entries",
                        lambda entries, vocab_size=None, **kw: (checked.append(vocab_size),
                                                                 real(entries, vocab_size=vocab_size, **kw))[1])
    monkeypatch.setattr(realization, "_decoded_memo", realization._decoded_memo.emptied())
    monkeypatch.setattr(realization, "_checked_memo", realization._checked_memo.emptied())
    choices = {"kind": "multiple_choice", "choices": [[5, 6], [7, 40]], "eos_token_id": 1}
    payload = [choices, {"kind": "banned_tokens", "token_ids": [9]}]
    for _ in range(3):
        assert sdk.realize(payload, vocab_size=64, stop_token_id=1) is not None
    sdk.validate(payload, vocab_size=64)
    narrow = sdk.realize(payload, vocab_size=32, stop_token_id=1)  # id 40 is beyond this width: checked again
    assert narrow is not None and narrow.failed and "vocab size 32" in (narrow.error or "")
    refused = [choices, {"kind": "banned_tokens", "token_ids": [5, 7]}]  # bans every first token of the choices
    for _ in range(2):
        with pytest.raises(SpecError, match="contradicts"):
            sdk.validate(refused, vocab_size=64)
    assert checked == [64, 32, 64, 64]


def test_decoded_payloads_are_kept_within_a_byte_budget_and_a_heavier_one_is_decoded_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a memo keeps is weighed by the bytes it holds (``deep_size`` of the entries and their
    JSON key): within a 64 KiB budget a small payload is decoded once, one of 4,000 ids every time."""
    from dynlogits.processors.kept import Kept
    from dynlogits.sdk import realization

    calls: list[object] = []
    real = realization.decode_entries
    monkeypatch.setattr(realization, "decode_entries", lambda payload, **kw: (calls.append(payload), real(payload, **kw))[1])
    monkeypatch.setattr(realization, "_decoded_memo", Kept(realization.DECODED_KEPT, 64 << 10))
    monkeypatch.setattr(realization, "_checked_memo", Kept(realization.DECODED_KEPT, 64 << 10))
    small = [{"kind": "banned_tokens", "token_ids": [5]}]
    large = [{"kind": "banned_tokens", "token_ids": list(range(1000, 5000))}]  # 20 KB of JSON, ~150 KiB decoded
    for payload in (small, small, large, large):
        sdk.validate(payload, vocab_size=8000)
    assert calls == [small, large, large]
    assert 0 < realization._decoded_memo.held < 4 << 10


def test_the_decode_memos_never_hold_more_than_their_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct payloads of ~25 KB of JSON (~0.4 MiB decoded) validated one after the other: the
    heap (``tracemalloc``) never holds more than the two memos' 1 MiB budgets, and they keep some."""
    import gc
    import random
    import tracemalloc

    from dynlogits.processors.kept import Kept
    from dynlogits.sdk import realization

    budget = 1 << 20
    monkeypatch.setattr(realization, "_decoded_memo", Kept(realization.DECODED_KEPT, budget))
    monkeypatch.setattr(realization, "_checked_memo", Kept(realization.DECODED_KEPT, budget))
    rng = random.Random(7)
    sdk.validate([{"kind": "banned_tokens", "token_ids": [5]}], vocab_size=50_000)  # warm: imports, adapters
    gc.collect()
    tracemalloc.start()
    try:
        start, peak = tracemalloc.get_traced_memory()[0], 0
        for _ in range(12):
            payload = [{"kind": "banned_tokens", "token_ids": rng.sample(range(1000, 50_000), 4000)},
                       {"kind": "banned_phrases", "phrases": [rng.sample(range(1000, 50_000), 64) for _ in range(64)]}]
            sdk.validate(payload, vocab_size=50_000)
            del payload
            gc.collect()
            peak = max(peak, tracemalloc.get_traced_memory()[0] - start)
    finally:
        tracemalloc.stop()
    memos = realization._decoded_memo, realization._checked_memo
    assert all(2 <= len(memo) and memo.held <= budget for memo in memos)
    assert peak <= 2 * budget, f"the heap holds {peak} bytes beyond the start; the memos' budgets are {2 * budget}"


@pytest.mark.heavy
def test_realizing_many_distinct_large_payloads_keeps_rss_within_the_memos_budgets() -> None:
    """``tests/sdk/memory_probe.py`` in a fresh process: 60 distinct payloads of ~1 MB, realized one
    after the other as an engine's model runner does (the choice and phrase tables they share
    included), grow its RSS by less than the four memos' budgets plus 32 MiB for the allocator.
    Before the memos were bounded in bytes, the same grew it by 378 MiB (here, 60 payloads)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from dynlogits.processors import banned_phrases, multiple_choice
    from dynlogits.sdk import realization

    probe = Path(__file__).with_name("memory_probe.py")
    out = subprocess.run([sys.executable, str(probe), "--payloads", "60"], capture_output=True, text=True,
                         timeout=600, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    budgets = 2 * realization.DECODED_BYTES + multiple_choice.TABLES_BYTES + banned_phrases.TABLES_BYTES
    assert all(0 < held for held in report["held"].values()), report
    assert report["growth_mib"] * (1 << 20) <= budgets + (32 << 20), report


def test_a_payload_of_a_kind_no_longer_in_force_is_refused_again() -> None:
    from dynlogits.specs.kinds import kinds_registered

    class Spec(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        kind: Literal["memo_probe"] = "memo_probe"

    probe = ProcessorKind("memo_probe", Spec, lambda entry, ctx: (lambda ids, row: None))
    payload = [{"kind": "memo_probe"}]
    with kinds_registered(probe):
        sdk.validate(payload)
    with pytest.raises(SpecError):
        sdk.validate(payload)
