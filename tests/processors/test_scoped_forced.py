"""``forced_sequence`` scoped to a phase (``scope.ScopedGroup``), and unscoped under drafts (the
gathered layout), settles its rows in one fused op where no later group masks them
(``ForcedSequenceGroup.settle_at_counts``: ``dynlogits::decided_settle_``, its CPU implementation
run here with its gate opened): every row equal to the hosted path's bit for bit, on the V1 runner's
interface (host histories) and through vLLM's real Model Runner V2 classes, drafts or not; forced
tokens the grammar masked fail the request on both paths alike."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from v2_rows import Request, rows_against_hosted, v1_batch, v1_step

from dynlogits import sdk
from dynlogits.kernels import thinking_force
from dynlogits.kernels.spans import GATE as SPANS_GATE
from dynlogits.sdk.realization import RequestFacts

V = 48
EOS = 1
IDS = [2, 3, 4, 5, 6, 7, 8]  # the delimiters among them: phases change often


def _payload(rng: random.Random, *, scoped: bool = True) -> list[dict[str, Any]]:
    forced = {"kind": "forced_sequence", "token_ids": rng.sample(range(10, 20), rng.randint(1, 4)), "eos_token_id": EOS}
    if not scoped:
        return [forced]
    reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                 "end_token_ids": [7, 8][: rng.randint(1, 2)]}
    return [reasoning, {**forced, "scope": rng.choice(["reasoning", "answer"])}]


def _logits(rng: random.Random, rows: int) -> torch.Tensor:
    """Random logits, now and then a forced id masked (a request that fails on both paths)."""
    out = torch.randn(rows, V)
    if rng.random() < 0.15:
        out[rng.randrange(rows), rng.randrange(10, 20)] = float("-inf")
    return out


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fused op's gate opened on the CPU; its calls counted (one entry per call)."""
    from dynlogits.processors import forced_sequence

    monkeypatch.setattr(thinking_force.GATE, "ready", lambda device: True)
    calls: list[int] = []
    op = forced_sequence.thinking_force.decided_settle_

    class Counted:
        def __getattr__(self, name: str) -> Any:
            return getattr(thinking_force, name)

        @staticmethod
        def decided_settle_(*args: Any) -> None:
            calls.append(len(args[1]))
            op(*args)

    monkeypatch.setattr(forced_sequence, "thinking_force", Counted())
    return calls


def test_the_v1_runners_scoped_forced_rows_settled_in_the_fused_op_equal_the_hosted_paths(settled: list[int]) -> None:
    """Random delimiters, prompts that may leave a span open, histories through both phases (a
    placeholder at the end of some), forced ids masked now and then: rows and failures as hosted."""
    rng = random.Random(5)
    resident_rows = failed = 0
    for _ in range(30):
        payloads = [_payload(rng) for _ in range(3)]
        prompts = [[rng.choice(IDS) for _ in range(rng.randint(1, 4))] for _ in payloads]
        resident = [sdk.realize(p, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=q))
                    for p, q in zip(payloads, prompts)]
        hosted = [sdk.realize(p, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=q))
                  for p, q in zip(payloads, prompts)]
        batch = v1_batch(resident, V)
        histories: list[list[int]] = [[], [], []]
        for _ in range(10):
            for h in histories:
                h.append(rng.choice(IDS))
            seen = [h + [-1] if rng.random() < 0.2 else list(h) for h in histories]
            logits = _logits(rng, 3)
            a, b = v1_step(batch, hosted, seen, logits)
            assert torch.equal(a, b)
            resident_rows += int((a != logits).any(1).sum())
        assert [r.failed for r in resident] == [r.failed for r in hosted]  # type: ignore[union-attr]
        failed += sum(bool(r.failed) for r in resident)  # type: ignore[union-attr]
    assert resident_rows > 50 and failed > 0 and len(settled) > 50


@pytest.mark.parametrize("spans", ["eager", "fused"], ids=["eager-spans", "fused-spans"])
@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("scoped", [True, False], ids=["scoped", "unscoped"])
def test_model_runner_v2s_forced_rows_settled_in_the_fused_op_equal_the_hosted_paths(
        drafts: int, scoped: bool, spans: str, settled: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Random requests through vLLM's V2 classes (slots reused, resumed outputs, drafts): every row
    as the hosted path's on the history it sees; a scoped entry's rows decided on the device, and
    with drafts the unscoped ones too through the fused op. ``spans``: a scoped row's stretch count
    decided by the eager ops (``StretchScopeTables.decide_state``) or in the fused span ops
    (``STRETCH``: their CPU implementations, as the CUDA model runs them)."""
    if spans == "fused":
        monkeypatch.setattr(SPANS_GATE, "run", lambda device, fused, eager: fused())
    rng = random.Random(17 + drafts + scoped)

    def new() -> Request:
        payload = _payload(rng, scoped=scoped)
        prompt = [rng.choice(IDS) for _ in range(rng.randint(1, 4))]
        output = [rng.choice(IDS) for _ in range(rng.choice([0, 1, 3, 20]))]
        made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt))
        return payload, True, prompt, output, made

    changed = rows_against_hosted(drafts, rng, new, IDS, vocab=V, eos=EOS, max_tokens=48,
                                  logits=lambda rows: torch.randn(rows, V))
    assert changed > 20
    if scoped or drafts:
        assert len(settled) > 10
    else:  # unscoped without drafts: the listed layout's own fused settle
        assert not settled
