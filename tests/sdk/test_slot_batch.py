"""``dynlogits.sdk.SlotBatch`` (the resident path) does exactly what the host path does, in each of
its layouts, through batch changes, failures and speculative drafts; and its steady state makes no
call that would synchronize with the device."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from dynlogits import sdk
from dynlogits.processors.device_thinking import DeviceThinking
from dynlogits.processors.forced_sequence import ForcedSequenceGroup
from dynlogits.sdk.resident.engine_step import EngineStep
from dynlogits.sdk.resident.slot_batch import SlotBatch
from dynlogits.specs import SpecError, decode_wire_payload

V = 64
EOS = 1
SLOTS = 12
NEG = float("-inf")


def random_payload(rng: random.Random) -> list[dict]:
    """A random consistent chain of built-in kinds (payloads refused at admission are redrawn)."""
    ids = lambda k: rng.sample(range(2, V), k)  # noqa: E731
    makers = [
        lambda: {"kind": "forced_sequence", "token_ids": ids(rng.randint(1, 5)), "eos_token_id": EOS},
        lambda: {"kind": "banned_tokens", "token_ids": ids(rng.randint(1, 6))},
        lambda: {"kind": "allowed_tokens", "token_ids": ids(rng.randint(1, 6)), "eos_token_id": EOS},
        lambda: {"kind": "logit_bias", "bias": {str(i): rng.uniform(-5, 5) for i in ids(rng.randint(1, 6))}},
        lambda: {"kind": "min_tokens", "min_tokens": rng.randint(1, 4), "stop_token_ids": [EOS]},
        lambda: {"kind": "thinking_budget", "start_token_ids": ids(rng.randint(1, 2)),
                 "end_token_ids": ids(rng.randint(1, 3)), "budget": rng.randint(0, 3)},
    ]
    while True:
        payload = [rng.choice(makers)() for _ in range(rng.randint(1, 4))]
        try:
            decode_wire_payload(payload, vocab_size=V)
        except SpecError:
            continue
        return payload


def realize(payload: list[dict], prompt: Sequence[int] = ()) -> sdk.GuardedRequest:
    request = sdk.realize(payload, vocab_size=V, stop_token_id=EOS, facts=sdk.RequestFacts(prompt_ids=prompt))
    assert request is not None and request.resident
    return request


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a, b))


class Engine:
    """A persistent-slot engine in miniature: requests in slots with their token histories, laid
    out in rows in a new order every step, some requests leaving and others arriving."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.batch = SlotBatch(num_slots=SLOTS, vocab_size=V, device="cpu")
        self.thinking = DeviceThinking(SLOTS + 1, "cpu", max_new=3)
        self.host: dict[int, sdk.GuardedRequest] = {}  # slot -> the host path's twin of the request
        self.history: dict[int, list[int]] = {}
        self.prompt: dict[int, list[int]] = {}

    def _prompt(self, payload: list[dict]) -> list[int]:
        """1-6 tokens, drawn mostly from the payload's thinking delimiters: prompts that leave a span
        open (some over budget already), close it, or end inside a delimiter."""
        marks = [t for e in payload if e["kind"] == "thinking_budget" for t in (*e["start_token_ids"], *e["end_token_ids"])]
        return [self.rng.choice(marks) if marks and self.rng.random() < 0.6 else self.rng.randrange(2, V)
                for _ in range(self.rng.randint(1, 6))]

    def add(self, slot: int, payload: list[dict], generated: Sequence[int] = ()) -> None:
        prompt = self._prompt(payload)
        self.batch.assign(slot, realize(payload, prompt))
        self.thinking.assign(slot, self.batch.requests[slot], resumed=len(generated))
        self.host[slot] = realize(payload, prompt)
        self.history[slot] = list(generated)
        self.prompt[slot] = prompt

    def remove(self, slot: int) -> None:
        self.batch.assign(slot, None)
        self.thinking.assign(slot, None)
        for table in (self.host, self.history, self.prompt):
            table.pop(slot)

    def token_matrix(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.zeros(SLOTS, 64, dtype=torch.int32)
        prompt = torch.zeros(SLOTS, dtype=torch.int32)
        total = torch.zeros(SLOTS, dtype=torch.int32)
        for slot, history in self.history.items():
            p = len(self.prompt[slot])
            tokens[slot, :p] = torch.tensor(self.prompt[slot], dtype=torch.int32)
            tokens[slot, p : p + len(history)] = torch.tensor(history, dtype=torch.int32)
            prompt[slot], total[slot] = p, p + len(history)
        return tokens, prompt, total


@pytest.mark.parametrize("mode", ["histories", "histories-numpy", "device"])
@pytest.mark.parametrize("seed", range(60))
def test_listed_layout_equals_the_host_path_through_batch_changes(seed: int, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows in a listed layout (vLLM V1, or V2 without drafts): positions from the histories' lengths
    (forced rows planned in Python, as for a few rows, or with numpy, as for many) and thinking_budget
    decided on the host, or both from the device; engine-masked tokens included; prompts that open,
    close or begin thinking spans."""
    if mode == "histories-numpy":
        monkeypatch.setattr(ForcedSequenceGroup, "_FEW_ROWS", 0)
    rng = random.Random(seed)
    engine = Engine(rng)
    for slot in rng.sample(range(SLOTS), rng.randint(1, 6)):
        engine.add(slot, random_payload(rng))
    for step in range(8):
        if step % 3 == 2:  # a batch change: one leaves, one arrives (resumed with tokens, sometimes)
            engine.remove(rng.choice(sorted(engine.host)))
            free = [s for s in range(SLOTS) if s not in engine.host]
            engine.add(rng.choice(free), random_payload(rng), [rng.randrange(2, V) for _ in range(rng.randint(0, 3))])
        engine.batch.flush()
        engine.thinking.flush()
        slots = list(engine.host)
        rng.shuffle(slots)
        rows = len(slots) + 2
        host_slots = np.full(rows, -1)
        where = rng.sample(range(rows), len(slots))
        host_slots[where] = slots
        engine.batch.set_rows(host_slots)
        logits = torch.randn(rows, V, generator=torch.Generator().manual_seed(100 * seed + step))
        if rng.random() < 0.4:  # the engine's grammar masked half the vocabulary of one row
            logits[where[0], rng.sample(range(V), V // 2)] = NEG
        expected = logits.clone()
        sdk.apply_rows(expected, where, [engine.host[s] for s in slots], [engine.history[s] for s in slots])
        got = logits.clone()
        histories = [engine.history.get(int(s), []) for s in host_slots]
        if mode.startswith("histories"):
            engine.batch.apply(got, EngineStep(histories=histories))
        else:
            engine.thinking.step(*engine.token_matrix())
            generated = torch.tensor([len(h) for h in histories])
            engine.batch.apply(got, EngineStep(generated=generated, thinking=engine.thinking.decide))
        assert same(got, expected), f"step {step}: rows differ at {(got != expected).nonzero()[:4].tolist()}"
        for row, slot in zip(where, slots):
            assert engine.batch.requests[slot].failed == engine.host[slot].failed
            engine.history[slot].append(int(got[row].argmax()))


@pytest.mark.parametrize("seed", range(60))
def test_gathered_layout_with_drafts_equals_the_host_path(seed: int) -> None:
    """Rows only the device can place (V2 under speculative decoding): one row per draft, drafts of
    a request in prefill are placeholders (-1). Committed rows equal the host path; draft rows equal
    the host path's draft rule (a failure stops the row only)."""
    rng = random.Random(seed)
    engine = Engine(rng)
    for slot in rng.sample(range(SLOTS), rng.randint(1, 5)):
        engine.add(slot, random_payload(rng))
    engine.batch.flush()
    engine.thinking.flush()
    for step in range(6):
        slots = list(engine.host)
        rng.shuffle(slots)
        row_slot, local, inputs, drafts_of = [], [], [], {}
        for slot in slots:
            drafts = [rng.randrange(2, V) for _ in range(rng.randint(0, 2))]
            if drafts and rng.random() < 0.15:
                drafts = [-1] * len(drafts)  # still in prefill: placeholders
            drafts_of[slot] = drafts
            last = engine.history[slot][-1] if engine.history[slot] else engine.prompt[slot][-1]
            for k, token in enumerate([last, *drafts]):
                row_slot.append(slot)
                local.append(k)
                inputs.append(token)
        logits = torch.randn(len(row_slot), V, generator=torch.Generator().manual_seed(100 * seed + step))
        expected = logits.clone()
        committed_rows = [r for r, k in enumerate(local) if k == 0]
        sdk.apply_rows(expected, committed_rows, [engine.host[row_slot[r]] for r in committed_rows],
                       [engine.history[row_slot[r]] for r in committed_rows])
        for r, k in enumerate(local):
            drafts = drafts_of[row_slot[r]][:k]
            if k and -1 not in drafts:
                sdk.apply_draft_row(engine.host[row_slot[r]], engine.history[row_slot[r]] + drafts, expected[r])
        got = logits.clone()
        slot_of_row = torch.tensor(row_slot)
        engine.batch.rows_on_device(slot_of_row, np.array(slots))
        engine.thinking.step(*engine.token_matrix(), input_ids=torch.tensor(inputs), local_pos=torch.tensor(local))
        generated = torch.tensor([len(engine.history[s]) + k for s, k in zip(row_slot, local)])
        engine.batch.apply(got, EngineStep(generated=generated, thinking=engine.thinking.decide, real_rows=torch.tensor(local) == 0))
        for r, k in enumerate(local):
            slot = row_slot[r]
            if k and (-1 in drafts_of[slot][:k] or engine.host[slot].failed):
                continue  # placeholder rows are discarded by the engine; a request failed this step
            assert same(got[r], expected[r]), f"step {step}, row {r} (slot {slot}, draft {k}) differs"
        for r in committed_rows:
            slot = row_slot[r]
            assert engine.batch.requests[slot].failed == engine.host[slot].failed
            engine.history[slot].append(int(got[r].argmax()))


def test_a_forced_token_the_engine_masked_fails_its_request_alone_with_the_reason() -> None:
    reports: list[str] = []
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
    forced = sdk.realize([{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}], vocab_size=V,
                         stop_token_id=EOS, report=reports.append)
    other = realize([{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}])
    batch.assign(0, forced)
    batch.assign(1, other)
    batch.set_rows(np.array([0, 1]))
    logits = torch.randn(2, V)
    logits[0, 5] = NEG  # the grammar forbids token 5 for request 0 only
    batch.apply(logits, EngineStep(histories=[[], []]))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]  # ended at once
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [5]
    assert forced.failed and not other.failed
    assert len(reports) == 1 and "no token left to sample at output position 0" in reports[0]
    logits = torch.randn(2, V)
    batch.apply(logits, EngineStep(histories=[[EOS], [5]]))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]  # stays fail-stopped
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [6]


SEQUENCES = ([5, 6, 7], [8], [9, 10, 11, 12, 13])


@pytest.mark.parametrize("source", ["histories", "histories-numpy", "generated", "pos"])
def test_a_forced_row_forces_its_sequence_at_every_position_from_prefill_to_past_its_end(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whichever way the runner gives positions (V1: histories, planned on the host; V2: ``pos``
    and ``pos_offset``, read without subtracting; or generated counts), a row forces
    ``sequence[generated]``, EOS once the sequence is spent, and ``sequence[0]`` on a row still in
    prefill (negative: its sample is discarded, never flagged)."""
    if source == "histories-numpy":  # many rows' planning, on these few
        monkeypatch.setattr(ForcedSequenceGroup, "_FEW_ROWS", 0)
    offset = 37  # prompt_len - 1 of every row
    for generated in ([-3, 0, 0], [-1, 1, 4], [0, 5, 5], [2, 9, 40]):
        if source.startswith("histories") and min(generated) < 0:
            continue  # a history is never shorter than empty
        batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
        requests = [realize([{"kind": "forced_sequence", "token_ids": list(seq), "eos_token_id": EOS}]) for seq in SEQUENCES]
        for slot, request in enumerate(requests):
            batch.assign(slot, request)
        batch.set_rows(np.array([2, 0, 1]))  # rows hold slots 2, 0, 1: not the identity
        ordered = [SEQUENCES[2], SEQUENCES[0], SEQUENCES[1]]
        logits = torch.randn(3, V)
        counts = torch.tensor(generated)
        if source.startswith("histories"):
            batch.apply(logits, EngineStep(histories=[[3] * g for g in generated]))
        elif source == "generated":
            batch.apply(logits, EngineStep(generated=counts))
        else:
            batch.apply(logits, EngineStep(pos=counts + offset, pos_offset=torch.full((3,), offset)))
        for row, (seq, g) in enumerate(zip(ordered, generated)):
            want = (*seq, EOS)[min(max(g, 0), len(seq))]
            assert torch.isfinite(logits[row]).nonzero().flatten().tolist() == [want], (source, generated, row)
        assert not any(r.failed for r in requests)


@pytest.mark.parametrize("source", ["histories", "histories-numpy", "generated", "pos"])
def test_a_masked_forced_token_flags_the_position_capped_at_the_sequences_end(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose forced token is masked is fail-stopped and its request failed with the output
    position; past the end of its sequence (EOS forced) the position reported is the sequence's
    length, where its EOS was first due; a row in prefill is never flagged."""
    if source == "histories-numpy":  # many rows' planning, on these few
        monkeypatch.setattr(ForcedSequenceGroup, "_FEW_ROWS", 0)
    cases = [(2, 2), (9, 5)] + ([] if source.startswith("histories") else [(-2, None)])
    for generated, reported in cases:
        reports: list[str] = []
        batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
        request = sdk.realize([{"kind": "forced_sequence", "token_ids": list(SEQUENCES[2]), "eos_token_id": EOS}],
                              vocab_size=V, stop_token_id=EOS, report=reports.append)
        batch.assign(0, request)
        batch.set_rows(np.array([0]))
        logits = torch.randn(1, V)
        logits[0, (*SEQUENCES[2], EOS)[min(max(generated, 0), 5)]] = NEG  # the grammar masks the forced token
        if source.startswith("histories"):
            batch.apply(logits, EngineStep(histories=[[3] * generated]))
        elif source == "generated":
            batch.apply(logits, EngineStep(generated=torch.tensor([generated])))
        else:
            batch.apply(logits, EngineStep(pos=torch.tensor([generated + 20]), pos_offset=torch.tensor([20])))
        assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]  # fail-stopped (or EOS kept)
        if reported is None:
            assert reports == [] and not request.failed
        else:
            assert len(reports) == 1 and f"at output position {reported}:" in reports[0], (source, generated, reports)


@pytest.mark.parametrize("source", ["histories", "histories-numpy", "generated", "pos"])
def test_a_masked_forced_row_without_a_stop_token_is_failed_and_left_with_no_token(
        source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows with and without a stop token side by side (``ignore_eos`` and no stop ids), some with
    their forced token masked: a row with a stop token is fail-stopped to it; one without is
    failed and keeps its forced id masked, nothing else written (no id unmasked, no other masked);
    live rows get their forced token. Every failure is reported with its position."""
    if source == "histories-numpy":
        monkeypatch.setattr(ForcedSequenceGroup, "_FEW_ROWS", 0)
    stops = [EOS, None, EOS, None]
    masked = [True, True, False, False]
    reports: list[str] = []
    batch = SlotBatch(num_slots=4, vocab_size=V, device="cpu")
    requests = []
    for slot, stop in enumerate(stops):
        request = sdk.realize([{"kind": "forced_sequence", "token_ids": list(SEQUENCES[2]), "eos_token_id": EOS}],
                              vocab_size=V, stop_token_id=stop, report=reports.append)
        assert request is not None
        batch.assign(slot, request)
        requests.append(request)
    batch.set_rows(np.array([3, 1, 0, 2]))  # row r holds slot host_slots[r]
    host_slots = [3, 1, 0, 2]
    generated = 2
    forced = SEQUENCES[2][generated]
    logits = torch.randn(4, V)
    for row, slot in enumerate(host_slots):
        if masked[slot]:
            logits[row, forced] = NEG
    if source.startswith("histories"):
        batch.apply(logits, EngineStep(histories=[[3] * generated] * 4))
    elif source == "generated":
        batch.apply(logits, EngineStep(generated=torch.full((4,), generated)))
    else:
        batch.apply(logits, EngineStep(pos=torch.full((4,), generated + 9), pos_offset=torch.full((4,), 9)))
    for row, slot in enumerate(host_slots):
        want = torch.full((V,), NEG)
        if masked[slot] and stops[slot] is not None:
            want[EOS] = 0.0
        if not masked[slot]:
            want[forced] = 0.0
        assert torch.equal(logits[row], want), (source, slot)
        assert requests[slot].failed == masked[slot], (source, slot)
    assert sorted(len(r) > 0 and f"at output position {generated}:" in r for r in reports) == [True, True]


def test_the_resident_path_refuses_logits_it_cannot_index_flat() -> None:
    """Flat indices assume ``[rows, vocab]`` rows laid end to end: another width, another rank or
    rows with gaps between them are refused before anything is written."""
    batch = SlotBatch(num_slots=2, vocab_size=V, device="cpu")
    batch.assign(0, realize([{"kind": "banned_tokens", "token_ids": [5]}]))
    batch.assign(1, realize([{"kind": "banned_tokens", "token_ids": [6]}]))
    batch.set_rows(np.array([0, 1]))
    wide = torch.randn(2, 2 * V)
    for bad, rule in ((torch.randn(2, V + 1), "width"), (torch.randn(2, 1, V), "width"),
                      (wide[:, ::2], "contiguous"), (wide[:, :V], "contiguous")):
        before = bad.clone()
        with pytest.raises(ValueError, match=rule):
            batch.apply(bad, EngineStep(histories=[[], []]))
        assert torch.equal(bad, before)
    one_row = wide[:1, :V]  # one row of a wider tensor: its row stride does not matter
    batch.set_rows(np.array([0]))
    batch.apply(one_row, EngineStep(histories=[[]]))
    assert one_row[0, 5] == NEG and torch.isfinite(wide[0, V:]).all()


SYNCING = {"tensor", "as_tensor", "item", "tolist", "numpy", "cpu"}


class SyncCounter(TorchFunctionMode):
    """Counts the calls that synchronize with the device or build tensors from host lists."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in SYNCING or (name == "to" and self._moves(args, kwargs) and not kwargs.get("non_blocking", False)):
            self.calls.append(name)
        return func(*args, **kwargs)

    @staticmethod
    def _moves(args: tuple, kwargs: dict) -> bool:
        """Whether a ``.to()`` names a device (a transfer on a machine with one), not just a dtype."""
        return "device" in kwargs or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])


def every_kind_payloads() -> list[list[dict]]:
    return [
        [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}],
        [{"kind": "banned_tokens", "token_ids": [3, 4]}, {"kind": "logit_bias", "bias": {"9": 2.0}}],
        [{"kind": "allowed_tokens", "token_ids": [5, 6, 7], "eos_token_id": EOS}, {"kind": "min_tokens", "min_tokens": 2,
                                                                              "stop_token_ids": [EOS]}],
        [{"kind": "thinking_budget", "start_token_ids": [10], "end_token_ids": [11, 12], "budget": 2}],
    ]


@pytest.mark.parametrize("mode", ["histories", "device"])
def test_steady_state_steps_make_no_syncing_call(mode: str) -> None:
    """Once the batch stopped changing, a step calls none of tensor(list), as_tensor, .item(),
    .tolist(), .numpy(), .cpu() or a blocking .to() (every built-in kind in the batch)."""
    batch = SlotBatch(num_slots=8, vocab_size=V, device="cpu")
    thinking = DeviceThinking(9, "cpu")
    histories = [[5], [20], [5], [10, 20, 30]]
    for slot, payload in enumerate(every_kind_payloads()):
        batch.assign(slot, realize(payload))  # a request that already holds tokens says so, as the adapter does
        thinking.assign(slot, batch.requests[slot], resumed=len(histories[slot]) if slot < len(histories) else 0)
    batch.flush()
    thinking.flush()
    batch.set_rows(np.array([0, 1, 2, 3]))
    tokens = torch.zeros(8, 16, dtype=torch.int32)
    for slot, h in enumerate(histories):
        tokens[slot, 1 : 1 + len(h)] = torch.tensor(h, dtype=torch.int32)
    prompt = torch.ones(8, dtype=torch.int32)
    total = prompt + torch.tensor([len(h) for h in histories] + [0] * 4, dtype=torch.int32)
    generated = torch.tensor([len(h) for h in histories])

    def step() -> torch.Tensor:
        logits = torch.randn(4, V)
        if mode == "histories":
            batch.apply(logits, EngineStep(histories=histories))
        else:
            thinking.step(tokens, prompt, total)
            batch.apply(logits, EngineStep(generated=generated, thinking=thinking.decide))
        return logits

    first = step()  # the first step after a batch change builds its index tensors
    with SyncCounter() as counter:
        later = step()
    assert counter.calls == []
    assert torch.isfinite(later[0]).nonzero().flatten().tolist() == [6] == torch.isfinite(first[0]).nonzero().flatten().tolist()
    assert torch.isfinite(later[3]).nonzero().flatten().tolist() == [11]  # the budget of 2 is spent: close the span


def test_the_sync_counter_sees_the_calls_it_forbids() -> None:
    with SyncCounter() as counter:
        torch.tensor([1, 2])
        torch.zeros(2).tolist()
        torch.zeros(1).item()
        torch.zeros(2).to("cpu")
        torch.zeros(2).to(torch.int32)  # a dtype change is no transfer
        torch.zeros(2).to("cpu", non_blocking=True)
    assert counter.calls == ["tensor", "tolist", "item", "to"]


def test_a_host_decided_row_whose_processor_raises_fails_its_request_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DecidedGroup.decide_rows`` row by row (a trigger, decided from each row's history on the V1 runner):
    the request whose processor raises fails and its row is fail-stopped; the rows before and after
    it are forced as usual."""
    from dynlogits.processors.trigger import TriggerProcessor

    payload = [{"kind": "trigger", "trigger_token_ids": [3], "phrase_token_ids": [9]}]
    requests = [sdk.realize(payload, vocab_size=V, stop_token_id=EOS) for _ in range(3)]
    broken = requests[1].processor.processors[0]
    real = TriggerProcessor.row_op

    def row_op(self: TriggerProcessor, ids: Sequence[int]):  # noqa: ANN202
        if self is broken:
            raise RuntimeError("processor bug")
        return real(self, ids)

    monkeypatch.setattr(TriggerProcessor, "row_op", row_op)
    batch = SlotBatch(num_slots=3, vocab_size=V, device="cpu", host_histories=True)
    for slot, request in enumerate(requests):
        assert batch.assign(slot, request)
    batch.flush()
    batch.set_rows(np.array([0, 1, 2]))
    logits = torch.randn(3, V)
    batch.apply(logits, EngineStep(histories=[[3], [3], [3]]))
    assert [r.failed for r in requests] == [False, True, False]
    assert [torch.isfinite(logits[r]).nonzero().flatten().tolist() for r in range(3)] == [[9], [EOS], [9]]
