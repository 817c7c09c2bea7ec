"""A scoped ``trigger`` (a span-following kind that opts in: ``TriggerGroup.scopable``) is resident
on both vLLM runners (``scope.ScopedSpan``): the phrase is forced after the trigger's first
occurrence within the current stretch of its phase, as the hosted path (``_ScopedPlanned``: the
processor called in phase only, on the stretch alone). With host histories (the V1 runner) each
row is decided from its stretch of the live list; without (Model Runner V2) ``DeviceThinking``
follows the trigger restarted at each stretch (``stretch_spans.StretchSpans``), drafts or not."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from v2_rows import paired_requests, resident_request, rows_against_hosted, rows_v1_against_hosted, v1_left, v2_harness, v2_params

from dynlogits import sdk
from dynlogits.kernels.spans import GATE
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.scope import ScopedSpan
from dynlogits.sdk.realization import RequestFacts

V = 48
EOS = 1
#: delimiters (5, 6 open; 7, 8 close) and trigger ids (2, 3) among them: phases change, triggers recur
IDS = [2, 3, 5, 7, 3, 8, 6, 9, 2]


def _payload(rng: random.Random) -> list[dict[str, Any]]:
    trigger = [rng.choice([2, 3, 2, 7]) for _ in range(rng.randint(1, 2))]
    phrase = [rng.choice([10, 11, 12, 7, 5]) for _ in range(rng.randint(1, 3))]
    return [{"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
             "end_token_ids": [7, 8][: rng.randint(1, 2)]},
            {"kind": "trigger", "trigger_token_ids": trigger, "phrase_token_ids": phrase,
             "scope": rng.choice(["reasoning", "answer"])}]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> Any:
    made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt, stop_token_ids=(EOS,)))
    assert made is not None
    return made


def _choose(rng: random.Random, row: torch.Tensor) -> int:
    """The forced token where the row is forced (so phrases are written out), else one of ``IDS``."""
    left = torch.isfinite(row).nonzero().flatten().tolist()
    return left[0] if len(left) == 1 else rng.choice(IDS)


def _forced(a: torch.Tensor, _: torch.Tensor) -> int:
    return int((torch.isfinite(a).sum(1) == 1).sum())


def test_the_v1_runners_scoped_trigger_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, triggers, phrases and prompts (which may open a span), live lists with
    placeholders: every request resident (``ScopedSpan``), every row as the hosted path's."""
    rng = random.Random(5)
    requests = paired_requests(rng, lambda: _payload(rng), _realize, IDS)
    forced = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=30, placeholders=0.2,
                                    logits=lambda: torch.randn(3, V), same=torch.equal, changed=_forced)
    assert forced > 20


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_trigger_rows_are_the_hosted_paths(drafts: int, path: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Random requests through vLLM's real Model Runner V2 classes (resumes, reused slots, drafts):
    every request resident, each row forced exactly where the hosted path forces it, nothing read
    back; the spans' fused ops (their CPU implementations, as the CUDA model runs them) or eager ops."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    rng = random.Random(23 + drafts)

    new = resident_request(rng, lambda: _payload(rng), _realize, IDS)
    assert rows_against_hosted(drafts, rng, new, IDS, vocab=V, eos=EOS, max_tokens=48,
                               logits=lambda rows: torch.randn(rows, V), choose=_choose) > 5


PAYLOAD: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                 {"kind": "trigger", "trigger_token_ids": [2, 3], "phrase_token_ids": [10, 11],
                                  "scope": "answer"}]


def _left(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_on_the_v1_runner_a_scoped_trigger_fires_only_on_its_stretch() -> None:
    """``2 3`` in reasoning fires nothing; ``2`` before the answer and ``3`` after it is no occurrence
    within the answer; ``2 3`` inside the answer forces the phrase's first token."""
    batch, left = v1_left(_realize(PAYLOAD, [9]), ([5, 2, 3], [5, 2, 7, 3], [5, 2, 7, 3, 2, 3], [5, 2, 7, 3, 2, 3, 10]), V)
    assert all(isinstance(g, ScopedSpan) for g in batch.groups.values())
    assert left == [list(range(V)), list(range(V)), [10], [11]]


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_scoped_trigger_restarts_at_each_stretch(drafts: int, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same request under V2, one token committed a step: an occurrence straddling the answer's
    start is none; one inside it fires; after a new reasoning span and a new answer, it fires again."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    harness = v2_harness(drafts, V)
    harness.add_request("a", [9], v2_params(PAYLOAD, 32, EOS), output_ids=[5, 2, 7, 3])
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    forced: list[tuple[int, list[int]]] = []
    for i, token in enumerate([None, 2, 3, 10, 11, 5, 2, 3, 7, 2, 3, 10, 11]):
        if token is not None:
            harness.commit("a", [token])
        left = _left(harness.step(["a"], torch.zeros(1, V)))
        if len(left) < V:
            forced.append((i, left))
    assert forced == [(2, [10]), (3, [11]), (10, [10]), (11, [11])]


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_a_delimiter_among_the_drafts_restarts_the_trigger_for_the_rows_after_it(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Committed ``5 2`` (reasoning, the trigger ``2`` in it), drafts ``7 2``: the row after ``7`` is
    the answer's first step (nothing), the row after ``7 2`` has seen the trigger in the answer: the
    phrase's first token, as the hosted path (an occurrence before the stretch counts for nothing)."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    harness = v2_harness(2, V)
    payload = [PAYLOAD[0], {**PAYLOAD[1], "trigger_token_ids": [2]}]
    harness.add_request("a", [9], v2_params(payload, 32, EOS), output_ids=[5])
    harness.step(["a"], torch.zeros(1, V))
    harness.commit("a", [2])
    out = harness.step(["a"], torch.zeros(3, V), drafts={"a": [7, 2]})
    assert [torch.isfinite(out[r]).nonzero().flatten().tolist() for r in range(3)] == \
        [list(range(V)), list(range(V)), [10]]


@pytest.mark.parametrize("path", ["eager", "fused"])
def test_under_model_runner_v2_a_request_resumed_mid_phrase_goes_on_with_it(path: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Resumed with more generated tokens than the device catches up on (``MAX_DEVICE_CATCH_UP``:
    its one host scan), the trigger fired in the answer and the phrase's first token written: the
    next step forces the second, as the hosted path (the scan's stretch start kept, no restart)."""
    if path == "fused":
        monkeypatch.setattr(GATE, "run", lambda device, fused, eager: fused())
    harness = v2_harness(0, V)
    output = [5, 9, 9, 7, *[9] * 12, 2, 3, 10]
    assert len(output) > DeviceThinking.MAX_DEVICE_CATCH_UP
    harness.add_request("a", [9], v2_params(PAYLOAD, 48, EOS), output_ids=output)
    assert _left(harness.step(["a"], torch.zeros(1, V))) == [11]
