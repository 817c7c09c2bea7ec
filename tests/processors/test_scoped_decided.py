"""A scoped entry of a decided kind that opts in (``no_repeat_ngram``, ``banned_phrases``,
``multiple_choice``: ``DecidedGroup.scopable``, ``WindowDecided.floored``) is resident (``scope.ScopedDecided``) and acts exactly as the
hosted path (``_ScopedPlanned``: the inner processor on its phase's stretch, ``_own``): on the V1
runner's interface (host histories) and, through vLLM's real Model Runner V2 classes
(``V2SamplerHarness``), with its rows decided on the device, drafts or not. A kind that does not
opt in, or an entry the device cannot decide, stays hosted and still acts as the hosted path."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from fused_gates import count_choice_steps
from v2_rows import Request, allowed_token, paired_requests, rows_against_hosted, rows_v1_against_hosted, v2_harness, v2_params

from dynlogits import sdk
from dynlogits.kernels.spans import GATE as SPANS_GATE
from dynlogits.processors.banned_phrases import BannedPhrasesGroup
from dynlogits.processors.no_repeat_ngram import NoRepeatNgramProcessor
from dynlogits.processors.no_repeat_ngram_device import MAX_DEVICE_SIZE
from dynlogits.processors.scope import TAIL_REREAD, Phases, ScopedDecided, _ScopedResident, scoped
from dynlogits.sdk.realization import RequestFacts
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch

V = 48
EOS = 1
IDS = [2, 3, 5, 7, 3, 3, 2, 8]  # few ids, delimiters among them: n-grams repeat, phases change


def _payload(rng: random.Random, *, size: int | None = None, kind: str = "no_repeat_ngram") -> list[dict[str, Any]]:
    """Random delimiters and one scoped entry of ``kind``: a ``no_repeat_ngram`` of ``size`` (random:
    1 to 4), or ``banned_phrases``, 1 to 4 phrases of 2 to 4 tokens whose prefixes are drawn from
    ``IDS`` (delimiters among them: a prefix may cross a stretch's start), a one-token phrase half the
    time."""
    reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                 "end_token_ids": [7, 8][: rng.randint(1, 2)]}
    scope = rng.choice(["reasoning", "answer"])
    if kind == "banned_phrases":
        phrases = [[rng.choice(IDS) for _ in range(rng.randint(1, 3))] + [rng.randrange(9, V)]
                   for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.5:
            phrases.append([rng.randrange(9, V)])
        return [reasoning, {"kind": kind, "phrases": phrases, "scope": scope}]
    return [reasoning, {"kind": "no_repeat_ngram", "size": size or rng.randint(1, 4), "scope": scope}]


def _realize(payload: list[dict[str, Any]], prompt: list[int]) -> Any:
    made = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=RequestFacts(prompt_ids=prompt))
    assert made is not None
    return made


@pytest.mark.parametrize("kind", ["no_repeat_ngram", "banned_phrases"])
def test_the_v1_runners_scoped_decided_rows_equal_the_hosted_paths_bit_for_bit(kind: str) -> None:
    """Random delimiters, prompts (which may open a span), entries (``_payload``) scoped to either
    phase; histories through both phases, each the engine's live list (grown in place, its newest
    slot sometimes a placeholder replaced in place at the next step, as vLLM's V1 runner under async
    scheduling) or a copy, some with a placeholder at the end. Every request is resident; every
    row equals the hosted path's."""
    rng = random.Random(7)

    requests = paired_requests(rng, lambda: _payload(rng, kind=kind), _realize, IDS)
    banned_rows = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=16, placeholders=0.3,
                                         logits=lambda: torch.randn(3, V), same=torch.equal,
                                         changed=lambda a, _: int(torch.isneginf(a).any(1).sum()))
    assert banned_rows > 100  # rows in scope with repeats were seen


@pytest.mark.parametrize("scope", ["reasoning", "answer"])
def test_a_scoped_no_repeat_ngram_bans_only_the_ngrams_of_its_phases_current_stretch(scope: str) -> None:
    """Size 2, delimiters 5 and 7; the output ``3 4 5 3 4 3 7 3``: in the answer, the stretch is
    ``3`` (the bigram ``3 4`` of the reasoning and before it does not count): nothing is banned; in
    reasoning the entry is idle. One step earlier (``... 5 3 4 3``) the reasoning stretch ``3 4 3``
    bans 4 where scoped to reasoning, and the answer entry is idle."""
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "no_repeat_ngram", "size": 2, "scope": scope}]
    request = _realize(payload, [2])
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    history = [3, 4, 5, 3, 4, 3]
    logits = torch.zeros(1, V)
    batch.apply(logits, EngineStep(histories=[history]))
    assert torch.isneginf(logits[0]).nonzero().flatten().tolist() == ([4] if scope == "reasoning" else [])
    history += [7, 3]
    logits = torch.zeros(1, V)
    batch.apply(logits, EngineStep(histories=[history]))
    assert not torch.isneginf(logits).any()


def _phrase_payload(scope: str) -> list[dict[str, Any]]:
    """Delimiters 5 and 7; phrases ``7 3 10`` (its prefix crosses the answer's start), ``3 11`` and
    ``12``, scoped to ``scope``."""
    return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
            {"kind": "banned_phrases", "phrases": [[7, 3, 10], [3, 11], [12]], "scope": scope}]


#: per scope, what the output ``5 3 7 3`` masks next: in the answer, 11 and 12, not 10 (``7 3``
#: crosses the stretch's start); in reasoning nothing (out of phase: the one-token phrase neither)
PHRASE_BANS = {"answer": [11, 12], "reasoning": []}


@pytest.mark.parametrize("scope", ["reasoning", "answer"])
def test_a_scoped_banned_phrase_matches_only_inside_its_phases_current_stretch(scope: str) -> None:
    """The V1 runner's interface (host histories): the output ``5 3 7 3`` (``PHRASE_BANS``); one step
    earlier (``5 3 7``) the answer's stretch is empty: its one-token phrase alone, and in reasoning
    (``5 3``) ``3 11`` matches there, beside the one-token phrase."""
    request = _realize(_phrase_payload(scope), [2])
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, request)
    assert all(isinstance(g, ScopedDecided) for g in batch.groups.values())
    batch.flush()
    batch.set_rows(np.array([0]))
    masked = []
    for history in ([5, 3], [5, 3, 7], [5, 3, 7, 3]):
        logits = torch.zeros(1, V)
        batch.apply(logits, EngineStep(histories=[history]))
        masked.append(torch.isneginf(logits[0]).nonzero().flatten().tolist())
    assert masked == ([[11, 12], [], []] if scope == "reasoning" else [[], [12], PHRASE_BANS[scope]])


def test_the_v1_runners_scoped_banned_phrases_write_no_window_tables() -> None:
    """With host histories nobody reads the kind's entry tables (``WindowDecided.tables_at_first_window``):
    none are built, however many phrases."""
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, _realize(_phrase_payload("answer"), [2]))
    batch.flush()
    batch.set_rows(np.array([0]))
    batch.apply(torch.zeros(1, V), EngineStep(histories=[[5, 3, 7, 3]]))
    (group,) = batch.groups.values()
    assert isinstance(group, ScopedDecided) and isinstance(group.inner, BannedPhrasesGroup)
    assert not group.inner.from_window and group.inner.entries == 0  # its tables: never grown


def test_without_host_histories_a_scoped_banned_phrases_is_admitted_against_the_members_tables() -> None:
    """A token window, no histories (Model Runner V2): 64 phrases of 64 tokens (4032 cells) and 256
    phrases of 2 tokens (256 cells) each fit ``MAX_WINDOW_CELLS`` alone, not together (the tables
    hold the members' most entries and columns): the second is hosted beside the first, though no
    step has run since the first was assigned (its tables written once admission asks)."""
    def payload(phrases: list[list[int]]) -> list[dict[str, Any]]:
        return [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                {"kind": "banned_phrases", "phrases": phrases, "scope": "answer"}]

    long = payload([[2 + k % 40] * 63 + [k % V] for k in range(64)])
    many = payload([[2 + k // V, k % V] for k in range(256)])
    alone = SlotBatch(num_slots=2, vocab_size=V, device="cpu", token_window=True)
    assert alone.assign(0, _realize(many, [2]))
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu", token_window=True)
    assert batch.assign(0, _realize(long, [2]))
    assert not batch.assign(1, _realize(many, [2]))
    assert batch.assign(1, _realize(long, [3]))


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("scope", ["reasoning", "answer"])
def test_under_model_runner_v2_a_scoped_banned_phrase_matches_only_inside_its_phases_current_stretch(
        scope: str, drafts: int) -> None:
    """Model Runner V2 (the floor into the fused op): the output ``5 3 7 3`` masks ``PHRASE_BANS``."""
    harness = _v2_harness(drafts)
    harness.add_request("a", [2], _params(_phrase_payload(scope), 16), output_ids=[5, 3, 7])
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    harness.commit("a", [3])
    out = harness.step(["a"], torch.zeros(1, V))
    assert torch.isneginf(out[0]).nonzero().flatten().tolist() == PHRASE_BANS[scope]


def test_a_scoped_entry_that_counts_the_prompt_is_not_resident() -> None:
    """``include_prompt`` (which the spec refuses with a scope) would ban the prompt's n-grams out
    of its phase too: a processor made with it, scoped, has no template (hosted)."""
    phases = Phases(((5,), (7,)), [2, 3])
    with_prompt = scoped(NoRepeatNgramProcessor(2, V, [2, 3]), "answer", phases)
    without = scoped(NoRepeatNgramProcessor(2, V), "answer", phases)
    assert not isinstance(with_prompt, _ScopedResident) and hasattr(with_prompt, "row_op")
    assert isinstance(without, _ScopedResident)


def test_a_scoped_thinking_budget_opts_in_and_is_resident() -> None:
    """``thinking_budget`` opts in (``DecidedGroup.scopable``): a scoped entry is resident, a
    ``ScopedSpan`` (its rows against the hosted path: ``test_scoped_thinking_budget.py``)."""
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21],
                                      "budget": 2, "scope": "reasoning"}]
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, _realize(payload, [2]))
    assert [type(g).__name__ for g in batch.groups.values()] == ["ScopedThinkingBudgetGroup"]


# -- multiple_choice: a restrictive kind (a row out of phase is left as it is, not filled) -----------
def _choice_payload(rng: random.Random) -> list[dict[str, Any]]:
    """Random delimiters and a ``multiple_choice`` of 1 to 4 choices of 1 to 3 tokens (delimiters
    among them: a choice may close or open a span) scoped to either phase."""
    reasoning = {"kind": "reasoning", "start_token_ids": [5, 6][: rng.randint(1, 2)],
                 "end_token_ids": [7, 8][: rng.randint(1, 2)]}
    choices = [[rng.choice([*IDS, 9, 10, 11]) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 4))]
    return [reasoning, {"kind": "multiple_choice", "choices": choices, "eos_token_id": EOS,
                        "scope": rng.choice(["reasoning", "answer"])}]


def _choose(rng: random.Random, row: torch.Tensor) -> int:
    """An id the hosted row allows, one of ``IDS`` (delimiters among them) where it allows any."""
    ids = [t for t in IDS if torch.isfinite(row[t])]
    return rng.choice(ids) if ids and rng.random() < 0.8 else allowed_token(rng, row)


def test_the_v1_runners_scoped_multiple_choice_rows_equal_the_hosted_paths_bit_for_bit() -> None:
    """Random delimiters, prompts, choices (``_choice_payload``), histories that follow what the
    hosted path allows: every request resident; in phase a row keeps its stretch's next ids, out of
    phase it is left as it is (not filled, never counted dead); every row equals the hosted path's."""
    rng = random.Random(17)

    requests = paired_requests(rng, lambda: _choice_payload(rng), _realize, IDS)
    restricted = rows_v1_against_hosted(rng, requests, IDS, vocab=V, steps=12, placeholders=0.0,
                                        logits=lambda: torch.randn(3, V), same=torch.equal,
                                        changed=lambda a, _: int(torch.isneginf(a).any(1).sum()), choose=_choose)
    assert restricted > 100


CHOICE_PAYLOAD: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                        {"kind": "multiple_choice", "choices": [[3], [4, 6]], "eos_token_id": EOS,
                                         "scope": "answer"}]
#: what ``CHOICE_PAYLOAD`` leaves after each output: all of it in reasoning, then the choices' ids
CHOICE_STEPS = [([5, 3], list(range(V))), ([5, 3, 7], [3, 4]), ([5, 3, 7, 4], [6]), ([5, 3, 7, 4, 6], [EOS])]


def test_a_scoped_multiple_choice_restricts_only_its_phases_current_stretch() -> None:
    """The V1 runner's interface: in reasoning the row is left whole; after the end delimiter the
    answer's stretch starts empty: the choices' first ids, then the rest of ``4 6``, then EOS."""
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    request = _realize(CHOICE_PAYLOAD, [2])
    assert batch.assign(0, request)
    batch.flush()
    batch.set_rows(np.array([0]))
    for history, allowed in CHOICE_STEPS:
        logits = torch.zeros(1, V)
        batch.apply(logits, EngineStep(histories=[history]))
        assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == allowed, history
    assert not request.failed


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_scoped_multiple_choice_restricts_only_its_phases_current_stretch(drafts: int) -> None:
    """Model Runner V2 (each row's first tokens read from its floor): ``CHOICE_STEPS`` row by row."""
    harness = _v2_harness(drafts)
    harness.add_request("a", [2], _params(CHOICE_PAYLOAD, 16), output_ids=[5])
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    for history, allowed in CHOICE_STEPS:
        harness.commit("a", history[len(harness.output_ids("a")):])
        out = harness.step(["a"], torch.zeros(1, V))
        assert torch.isfinite(out[0]).nonzero().flatten().tolist() == allowed, history
    assert not harness.processor.failures


def _fused_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The span following through its fused ops' CPU implementations (``spans_advance_``,
    ``spans_drafts_``), as the CUDA model runs them: each row's floor is the ``FLOOR`` rule's."""
    monkeypatch.setattr(SPANS_GATE, "run", lambda device, fused, eager: fused())


@pytest.mark.parametrize("spans", ["eager", "fused"], ids=["eager-spans", "fused-spans"])
@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_multiple_choice_rows_are_decided_on_the_device_as_the_hosted_path(
        drafts: int, fused: bool, spans: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random choices, delimiters, prompts that may open a span, resumes, drafts, tokens the hosted
    path allows: every request resident (each row's floor into the kind's step, no history read
    back); rows equal the hosted path's bit for bit, none fails. ``fused``: the step through
    ``dynlogits::multiple_choice_keep_`` (its CPU implementation; its gate opened on the CPU), with
    drafts too (the op given ``input_ids``: counted); ``spans``: the floors decided by the eager
    ops (``FloorScopeTables.decide_state``) or in the fused span ops (``FLOOR``)."""
    if spans == "fused":
        _fused_spans(monkeypatch)
    drafted: list[bool] = count_choice_steps(monkeypatch) if fused else []  # per fused step: drafts read
    rng = random.Random(71 + drafts)

    def new() -> Request:
        payload = _choice_payload(rng)
        prompt = [rng.choice(IDS) for _ in range(rng.randint(1, 4))]
        hosted = _realize(payload, prompt)
        output: list[int] = []
        for _ in range(rng.choice([0, 1, 3, 8])):  # a resumed output the entry allows
            row = torch.randn(1, V)
            sdk.apply_rows(row, [0], [hosted], [output])
            output.append(_choose(rng, row[0]))
        return payload, True, prompt, output, _realize(payload, prompt)

    assert rows_against_hosted(drafts, rng, new, IDS, vocab=V, eos=EOS, max_tokens=48,
                               logits=lambda rows: torch.randn(rows, V), choose=_choose) > 20
    if fused:  # every step through the op; with drafts most of them read drafts
        assert len(drafted) > 20 and (sum(drafted) > 10 if drafts else not any(drafted)), drafted


# -- Model Runner V2 (vLLM's real V2 classes, the runner's buffers as plain tensors) -----------------
def _v2_harness(drafts: int) -> Any:
    return v2_harness(drafts, V)


def _params(payload: list[dict[str, Any]], max_tokens: int) -> Any:
    return v2_params(payload, max_tokens, EOS)


def _run_v2(drafts: int, seed: int, sizes: tuple[int, ...], *, max_tokens: int = 48, kind: str = "no_repeat_ngram") -> int:
    """Random requests (``_payload``'s of ``kind``; sizes among ``sizes``) through a V2 harness
    (slots reused, outputs a request resumes with, some past ``DeviceThinking.MAX_DEVICE_CATCH_UP``,
    drafts), each resident where the device decides it (``banned_phrases``; a size up to
    ``MAX_DEVICE_SIZE``, whatever ``max_tokens``), else hosted; every row against the hosted path on
    the history it sees; how many rows had bans."""
    rng = random.Random(seed)

    def new() -> Request:
        payload = _payload(rng, size=rng.choice(sizes), kind=kind)
        prompt = [rng.choice(IDS) for _ in range(rng.randint(1, 4))]
        output = [rng.choice(IDS) for _ in range(rng.choice([0, 1, 3, 20]))]
        return payload, payload[1].get("size", 0) <= MAX_DEVICE_SIZE, prompt, output, _realize(payload, prompt)

    return rows_against_hosted(drafts, rng, new, IDS, vocab=V, eos=EOS, max_tokens=max_tokens,
                               logits=lambda rows: torch.randn(rows, V))


@pytest.mark.parametrize("spans", ["eager", "fused"], ids=["eager-spans", "fused-spans"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_no_repeat_ngram_rows_are_decided_on_the_device_as_the_hosted_path(
        drafts: int, spans: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request resident (no history read back); rows equal the hosted path's bit for bit,
    the floors decided eagerly or in the fused span ops (``_fused_spans``)."""
    if spans == "fused":
        _fused_spans(monkeypatch)
    assert _run_v2(drafts, 11 + drafts, (1, 2, 3, 4)) > 20


@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_banned_phrases_rows_are_decided_on_the_device_as_the_hosted_path(drafts: int) -> None:
    """Random phrase sets whose prefixes may cross a stretch's start (delimiters among their
    tokens), prompts that may open a span, resumes, drafts: every request resident (a per-row floor
    into the fused op, no history read back); rows equal the hosted path's bit for bit."""
    assert _run_v2(drafts, 61 + drafts, (0,), kind="banned_phrases") > 20


@pytest.mark.parametrize("drafts", [0, 2])
def test_model_runner_v2s_scoped_rows_beside_hosted_ones_are_each_the_hosted_paths(drafts: int) -> None:
    """Sizes 2 (resident) and 9 (hosted) in one batch: the hosted requests' rows are no member of
    the scoped group (nothing banned there by the device) and every row is the hosted path's."""
    assert _run_v2(drafts, 31 + drafts, (2, 2, MAX_DEVICE_SIZE + 1)) > 10


def test_a_scoped_no_repeat_ngram_the_device_does_not_decide_is_hosted_under_model_runner_v2() -> None:
    """A size past ``MAX_DEVICE_SIZE``: hosted there, and still the hosted path's rows."""
    _run_v2(0, 5, (MAX_DEVICE_SIZE + 1,))


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_scoped_no_repeat_ngram_with_a_max_tokens_above_8192_is_resident(drafts: int) -> None:
    """``max_tokens`` 8193 and 40000 (vLLM's server default is the model's length less the prompt):
    resident (the rows read the engine's matrix in place, no copy of ``max_tokens`` tokens a row),
    every row the hosted path's."""
    assert _run_v2(drafts, 41 + drafts, (1, 2, 3), max_tokens=8193) > 10
    assert _run_v2(drafts, 51 + drafts, (2, 4), max_tokens=40000) > 10


@pytest.mark.parametrize("drafts", [0, 2])
def test_under_model_runner_v2_a_reasoning_span_the_prompt_opened_counts_from_the_output(drafts: int) -> None:
    """Size 1 scoped to reasoning, the prompt ``2 5 3`` opening the span before its last token: the
    first row bans nothing (the stretch is the output: the prompt's ``3`` is no token of it); after
    ``4`` it bans 4 alone; once ``7`` closes the span, nothing."""
    harness = _v2_harness(drafts)
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "no_repeat_ngram", "size": 1, "scope": "reasoning"}]
    harness.add_request("a", [2, 5, 3], _params(payload, 16))
    assert harness.processor._is_resident[harness.reqs["a"].slot]
    banned = []
    for token in (4, 7, 3):
        out = harness.step(["a"], torch.zeros(1, V))
        banned.append(torch.isneginf(out[0]).nonzero().flatten().tolist())
        harness.commit("a", [token])
    assert banned == [[], [4], []]


def test_the_v1_runners_scoped_rows_follow_long_stretches_of_one_live_list_as_the_hosted_path() -> None:
    """One live list grown through reasoning stretches longer than ``TAIL_REREAD`` (the stretch's
    copy is re-read only that far back at a steady step), closed and opened again, the second first
    seen already longer than that (tokens the row was not decided at): every row equals the hosted
    path's, so the second stretch never sees the first's n-grams."""
    rng = random.Random(3)
    payload: list[dict[str, Any]] = [{"kind": "reasoning", "start_token_ids": [5], "end_token_ids": [7]},
                                     {"kind": "no_repeat_ngram", "size": 2, "scope": "reasoning"}]
    resident, hosted = _realize(payload, [2]), _realize(payload, [2])
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu", host_histories=True)
    assert batch.assign(0, resident)
    batch.flush()
    batch.set_rows(np.array([0]))
    first = [rng.choice([10, 11, 12, 13]) for _ in range(TAIL_REREAD + 20)]
    second = [rng.choice([20, 21, 22, 23]) for _ in range(TAIL_REREAD + 20)]
    live: list[int] = []
    banned = 0
    steps = [[t] for t in [5, *first, 7, 3, 4]] + [[5, *second[:TAIL_REREAD + 10]]] + [[t] for t in second[TAIL_REREAD + 10:]]
    for tokens in steps:
        live.extend(tokens)
        logits = torch.randn(1, V)
        a, b = logits.clone(), logits.clone()
        batch.apply(a, EngineStep(histories=[live]))
        sdk.apply_rows(b, [0], [hosted], [live])
        assert torch.equal(a, b), len(live)
        banned += int(torch.isneginf(a).any())
    assert banned > TAIL_REREAD // 2
