"""Whole sequences through each adapter as its engine drives it, on ``simcuda``'s CUDA model: what
would synchronize with the device, and how many device ops a steady step queues.

A ``Scenario`` changes the batch at nearly every step (admissions, removals, V1 moves, V2 slot
reuse, V2 drafts), with every built-in kind, a request whose forced token the grammar masks (it
must be reported, also when the engine ends it first) and, with ``hosted``, a ``python`` kind.
Only the adapter's calls are recorded; between steps the device catches up (``SimCuda.advance``).
``DriveResult``: ``syncs`` over the sequence, ``launches`` of a steady step, ``failures`` reported."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from dynlogits import sdk
from dynlogits.sdk.readback import INBOX
from dynlogits.testing.cuda.simcuda import SimCuda, Sync

__all__ = ["AFTER", "ROW_ENGINES", "CountError", "DriveResult", "Scenario", "builtin_payloads", "drive_apply_rows", "drive_v1", "drive_v2",
           "failure_then", "realizing"]

EOS = 1
GRAMMAR_MASKED = 7  # the token the "grammar" masks: forcing it must fail its request


@dataclass
class DriveResult:
    syncs: list[Sync] = field(default_factory=list)
    launches: int = 0
    steady_ops: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: each step's logits after the adapter's ``apply`` (host copies)
    logits: list[torch.Tensor] = field(default_factory=list)


def builtin_payloads(vocab: int) -> list[list[dict[str, Any]]]:
    """One request per built-in kind (and two stacked), ids inside ``vocab`` and never ``EOS``."""
    top = vocab - 2
    return [
        [{"kind": "forced_sequence", "token_ids": [5, 6, top, 8, 9, 10, 11, 12], "eos_token_id": EOS}],
        [{"kind": "banned_tokens", "token_ids": [3, 4, top]}, {"kind": "logit_bias", "bias": {"9": 2.0, str(top): -1.0}}],
        [{"kind": "allowed_tokens", "token_ids": [5, 6, top], "eos_token_id": EOS},
         {"kind": "min_tokens", "min_tokens": 2, "stop_token_ids": [EOS]}],
        [{"kind": "thinking_budget", "start_token_ids": [20], "end_token_ids": [21, 22], "budget": 2}],
    ]


FAILING = [{"kind": "forced_sequence", "token_ids": [GRAMMAR_MASKED, 6], "eos_token_id": EOS}]
HOSTED = [{"kind": "python", "factory": "dynlogits.testing.faults:scale", "kwargs": {"scale": 0.5}}]


@dataclass
class Scenario:
    """A sequence of ``steps`` steps. With ``changes``, each driver changes its batch before some
    steps (failing requests arrive, rows leave, swap or move, a slot is reused, a hosted request
    arrives); without, every request arrives at step 0 and the batch stays as it is."""

    vocab: int = 64
    steps: int = 12
    hosted: bool = False
    payloads: Sequence[list[dict[str, Any]]] | None = None
    seed: int = 0
    #: ``False``: every request arrives at step 0 and nothing changes after (a steady state)
    changes: bool = True
    #: the initial requests have no stop token (``ignore_eos``, no stop ids), as in a load test
    ignore_eos: bool = False

    def initial(self) -> list[list[dict[str, Any]]]:
        return list(self.payloads) if self.payloads is not None else builtin_payloads(self.vocab)


def _grammar(sim: SimCuda, logits: torch.Tensor, rows: Sequence[int]) -> None:
    """The engine's grammar bitmask: ``GRAMMAR_MASKED`` is not allowed in ``rows``."""
    with sim.paused():
        for r in rows:
            logits.elem[r, GRAMMAR_MASKED] = float("-inf")  # type: ignore[attr-defined]  # a SimTensor: its CPU tensor


def _logits(sim: SimCuda, rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    return sim.put(torch.randn(rows, vocab, generator=gen))


def _sampled(sim: SimCuda, logits: torch.Tensor) -> list[int]:
    return sim.value(logits).argmax(dim=-1).tolist()


# -- vLLM V1 runner -------------------------------------------------------------------------------
def _v1_config(vocab: int, slots: int) -> Any:
    return SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: vocab, runner_type="generate"),
                           scheduler_config=SimpleNamespace(max_num_seqs=slots), speculative_config=None,
                           parallel_config=None, kv_transfer_config=None)


def _params(payload: list[dict[str, Any]], **kwargs: Any) -> Any:
    from vllm import SamplingParams

    from dynlogits.specs import WIRE_KEY

    params = SamplingParams(extra_args={WIRE_KEY: payload}, **kwargs)
    params.update_from_generation_config({}, EOS)
    return params


def drive_v1(sim: SimCuda, scenario: Scenario) -> DriveResult:
    """``DynamoVllmLogitsProcessor`` on the V1 runner's interface, fed ``BatchUpdate``s."""
    from vllm.v1.sample.logits_processor import BatchUpdateBuilder, MoveDirectionality

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

    vocab = scenario.vocab
    with sim.paused():
        processor = DynamoVllmLogitsProcessor(_v1_config(vocab, max(16, len(scenario.initial()) + 4)), sim.device, True)
    builder = BatchUpdateBuilder()
    rows: list[list[int] | None] = []  # row -> live output list
    payloads = scenario.initial()
    gen = torch.Generator().manual_seed(scenario.seed)
    result = DriveResult()
    failing: set[int] = set()  # the failing requests' output lists (they move with their rows)

    def add(payload: list[dict[str, Any]], **kwargs: Any) -> int:
        row = len(rows)
        output: list[int] = []
        rows.append(output)
        builder.added.append((row, _params(payload, **kwargs), [2, 3], output))
        return row

    for payload in payloads:
        add(payload, ignore_eos=scenario.ignore_eos)
    steady_at = {scenario.steps - 1}
    ending: set[int] = set()  # failing requests with a stop token: the engine ends them once they sample it
    finished: list[int] = []
    for step in range(scenario.steps):
        changed = step == 0 or (scenario.changes and (step in (1, 2, 7) or (step == 5 and scenario.hosted)))
        for r in finished:  # as the scheduler does: a request that sampled its stop token leaves
            builder.removed_append(r)
            rows[r] = None
            changed = True
        finished = []
        if scenario.changes and step == 1:  # failing requests arrive (one with no stop token), the second row leaves
            ending.add(id(rows[add(FAILING)]))
            failing.add(id(rows[add(FAILING, ignore_eos=True)]))
            failing |= ending
            if len(payloads) > 1:
                builder.removed_append(1)
                rows[1] = None
        elif scenario.changes and step == 2:
            builder.moved.append((0, 2, MoveDirectionality.SWAP))
            rows[0], rows[2] = rows[2], rows[0]
        elif scenario.changes and step == 5 and scenario.hosted:
            add(HOSTED)
        elif scenario.changes and step == 7:  # another leaves, one arrives into its row
            builder.removed_append(0)
            output: list[int] = []
            rows[0] = output
            builder.added.append((0, _params(payloads[0]), [2, 3], output))
        update = builder.get_and_reset(len(rows)) if changed else None
        logits = _logits(sim, len(rows), vocab, gen)
        _grammar(sim, logits, [r for r, out in enumerate(rows) if out is not None and id(out) in failing])
        before = sim.launches
        processor.update_state(update)
        processor.apply(logits)
        if step in steady_at:
            result.launches = sim.launches - before
            result.steady_ops = sim.ops[before:]
        with sim.paused():
            result.logits.append(sim.value(logits).clone())
            for r, token in enumerate(_sampled(sim, logits)):
                if rows[r] is not None:
                    rows[r].append(token)  # type: ignore[union-attr]  # checked not None just above
                    if token == EOS and id(rows[r]) in ending:
                        finished.append(r)
        sim.advance()
    result.syncs = list(sim.syncs)
    result.failures = list(processor.failures)
    return result


# -- vLLM Model Runner V2 -------------------------------------------------------------------------
def drive_v2(sim: SimCuda, scenario: Scenario, *, drafts: int = 0) -> DriveResult:
    """``DynamoVllmLogitsProcessor`` on Model Runner V2's interface (``V2SamplerHarness`` with its
    buffers on the simulated device); ``drafts`` speculative tokens per request from step 4 on."""
    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.adapters.vllm.harness import V2SamplerHarness

    vocab = scenario.vocab
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None,
                             use_v2_model_runner=True, model_config=None)
    with sim.paused():
        harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=vocab,
                                   max_num_reqs=max(8, len(scenario.initial()) + 4), max_model_len=64,
                                   vllm_config=config, device=sim.device, to_device=sim.wrap)
    processor = harness.processor
    gen = torch.Generator().manual_seed(scenario.seed)
    rng = random.Random(scenario.seed)
    result = DriveResult()
    batch: list[str] = []
    failing: str | None = None

    def add(name: str, payload: list[dict[str, Any]]) -> None:
        with sim.paused():
            params = _params(payload)
        harness_add(harness, sim, name, params)
        batch.append(name)

    for i, payload in enumerate(scenario.initial()):
        add(f"r{i}", payload)
    steady_at = scenario.steps - 1
    ended = False  # the failing request sampled its stop token: the scheduler ends it at the next step
    for step in range(scenario.steps):
        if ended and failing in batch:
            with sim.paused():
                harness.remove_request(failing)
            batch.remove(failing)
        if not scenario.changes:
            pass
        elif step == 1:
            failing = "fail"
            add(failing, FAILING)
            if "r1" in batch:
                with sim.paused():
                    harness.remove_request("r1")
                batch.remove("r1")
        elif step == 2:  # V2 reorders rows freely
            batch.reverse()
        elif step == 5 and scenario.hosted:
            add("hosted", HOSTED)
        elif step == 6:  # a preempted request resumes with tokens already generated (thinking: scanned once)
            with sim.paused():
                params = _params(builtin_payloads(vocab)[3])
            harness_add(harness, sim, "resumed", params, output_ids=[20, 30, 31])
            batch.append("resumed")
        elif step == 7:  # a slot is reused by a new request
            with sim.paused():
                harness.remove_request("r0")
            batch.remove("r0")
            add("r0b", scenario.initial()[0])
        step_drafts = {q: [rng.randrange(2, vocab) for _ in range(drafts)] for q in batch} if drafts and step >= 4 else {}
        processor.apply_staged_writes()
        with sim.paused():
            ctx = harness.context(batch, step_drafts)
        rows = [q for q in batch for _ in range(1 + len(step_drafts.get(q, ())))]
        logits = _logits(sim, len(rows), vocab, gen)
        if failing is not None and failing in batch:
            _grammar(sim, logits, [r for r, q in enumerate(rows) if q == failing])
        before = sim.launches
        processor.apply(logits, ctx)
        if step == steady_at:
            result.launches = sim.launches - before
            result.steady_ops = sim.ops[before:]
        with sim.paused():
            result.logits.append(sim.value(logits).clone())
            sampled = _sampled(sim, logits)
            first = 0
            for q in batch:
                harness.commit(q, [sampled[first]])
                ended |= q == failing and sampled[first] == EOS
                first += 1 + len(step_drafts.get(q, ()))
        sim.advance()
    result.syncs = list(sim.syncs)
    result.failures = list(processor.failures)
    return result


def harness_add(harness: Any, sim: SimCuda, name: str, params: Any, output_ids: Sequence[int] = ()) -> None:
    """``V2SamplerHarness.add_request`` with the runner's part unrecorded and the adapter's recorded."""
    processor = harness.processor
    real = processor.add_request
    calls: list[tuple[int, Any]] = []
    def add_request(slot: int, p: Any) -> bool:  # the runner's call, recorded: the request needs processing
        calls.append((slot, p))
        return True

    processor.add_request = add_request
    try:
        with sim.paused():
            slot = harness.add_request(name, [2, 3], params, output_ids=output_ids)
    finally:
        del processor.add_request
    harness.needs_processing[slot] = real(*calls[0])


# -- the row-wise engines (SGLang, TensorRT-LLM, transformers): ``sdk.apply_rows`` ---------------
RowCall = Callable[[torch.Tensor, list[int], list[list[dict[str, Any]]], list[list[int]]], list[str]]


def drive_apply_rows(sim: SimCuda, scenario: Scenario, call: Callable[[], RowCall]) -> DriveResult:
    """An engine that hands rows and histories every step: ``call()`` builds the adapter's entry
    point, called as ``(logits, rows, payloads, histories) -> failures so far``."""
    vocab = scenario.vocab
    entry = call()
    gen = torch.Generator().manual_seed(scenario.seed)
    payloads = scenario.initial()
    histories: list[list[int]] = [[] for _ in payloads]
    result = DriveResult()
    for step in range(scenario.steps):
        if step == 1:
            payloads = [FAILING, *payloads[:1], *payloads[2:]]
            histories = [[], *histories[:1], *histories[2:]]
        if step == 5 and scenario.hosted:
            payloads.append(HOSTED)
            histories.append([])
        logits = _logits(sim, len(payloads), vocab, gen)
        if step >= 1:
            _grammar(sim, logits, [0])
        before = sim.launches
        result.failures = entry(logits, list(range(len(payloads))), payloads, histories)
        if step == scenario.steps - 1:
            result.launches = sim.launches - before
            result.steady_ops = sim.ops[before:]
        with sim.paused():
            for h, token in zip(histories, _sampled(sim, logits)):
                h.append(token)
        sim.advance()
    result.syncs = list(sim.syncs)
    return result


class CountError(RuntimeError):
    """``adapter_counts``' requests failed in its steady sequence (which has no failing request):
    its counts would be those of failed requests, not of their entries' work."""


#: ``adapter_counts(repeating=True)``: the width and length of its steady sequences (narrow enough
#: that random argmax histories repeat n-grams within the steps), how many it runs (seeds 0, 1, ...:
#: whether the last step of one finds a repeat is chance) and the width and length of the changing
#: one (wide enough for ``builtin_payloads``' ids, which its batch changes add).
REPEATING_STEADY = (4, 16)
REPEATING_SEEDS = 4
REPEATING_CHANGING = (32, 16)


def adapter_counts(impl: str, vocab: int, payloads: Sequence[list[dict[str, Any]]], *,
                   repeating: bool = False) -> tuple[int, int]:
    """``(launches, syncs)`` of ``impl`` (``adapter``: V1 runner; ``adapter_v2``: Model Runner V2)
    for these requests: device ops of a steady step, and syncs over a sequence with batch changes
    and a failing request (``Scenario``).

    ``repeating``: for payloads whose work depends on repeats in the history and that name no ids
    (``no_repeat_ngram``, ``dry``): the sequences run narrower and longer (``REPEATING_STEADY``,
    ``REPEATING_CHANGING``) so the sampled histories repeat, and the launches are the most of the last
    steps of ``REPEATING_SEEDS`` steady sequences (at ``vocab`` wide a random history repeats nothing
    in a few steps: the step would count an idle entry). Device ops per step do not depend on the
    width. ``CountError`` where a request fails in a steady sequence (it has no failing request: the
    counts would be a failed request's)."""
    drive = drive_v1 if impl == "adapter" else drive_v2
    steady_vocab, steady_steps = REPEATING_STEADY if repeating else (vocab, 3)
    changing_vocab, changing_steps = REPEATING_CHANGING if repeating else (vocab, 9)
    quiet = logging.getLogger("dynlogits")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the failing request of the sequence is expected: do not print it
    try:
        steady = []
        for seed in range(REPEATING_SEEDS if repeating else 1):
            with SimCuda() as sim:
                steady.append(drive(sim, Scenario(vocab=steady_vocab, payloads=payloads, steps=steady_steps,
                                                  changes=False, seed=seed)))
        with SimCuda() as sim:
            changing = drive(sim, Scenario(vocab=changing_vocab, payloads=payloads, steps=changing_steps))
    finally:
        quiet.setLevel(level)
    failed = [run.failures[0] for run in steady if run.failures]
    if failed:
        raise CountError(f"{impl}: a request failed in the steady sequence: {failed[0]}")
    return max(run.launches for run in steady), len(changing.syncs)


# -- the row-wise adapters' entry points, as drive_apply_rows calls them -------------------------
def realizing(report: list[str]) -> Callable[[torch.Tensor, list, list], list[sdk.GuardedRequest | None]]:
    realized: dict[int, sdk.GuardedRequest | None] = {}

    def get(logits: torch.Tensor, payloads: list, _: list) -> list[sdk.GuardedRequest | None]:
        return [realized.setdefault(id(p), sdk.realize(p, vocab_size=logits.shape[-1], stop_token_id=EOS,
                                                       report=report.append)) for p in payloads]

    return get


def _trtllm_entry() -> Callable[..., list[str]]:
    from dynlogits.adapters.trtllm.processor import FAILURES, DynamoTrtllmLogitsProcessor

    made: dict[int, Any] = {}
    start = len(FAILURES)

    def call(logits: torch.Tensor, rows: list[int], payloads: list, histories: list) -> list[str]:
        for row, payload, history in zip(rows, payloads, histories):
            proc = made.get(id(payload))
            if proc is None:  # its first call sees the prompt only: generation starts after it
                params = SimpleNamespace(end_id=EOS, stop_token_ids=None, ignore_eos=False)
                proc = made[id(payload)] = DynamoTrtllmLogitsProcessor(payload, sampling_params=params)
            proc(row, logits[row].view(1, 1, -1), [[2, 3, *history]], None)
        return list(FAILURES)[start:]

    call.failures = lambda: list(FAILURES)[start:]  # type: ignore[attr-defined]  # the driver reads its reports off the call
    return call


def _sglang_entry() -> Callable[..., list[str]]:
    from dynlogits.adapters.sglang.compat import import_sglang_srt

    import_sglang_srt()
    from dynlogits.adapters.sglang.custom_params import encode_carried
    from dynlogits.adapters.sglang.processor import FAILURES, DynamoSglangLogitProcessor
    from dynlogits.specs import WIRE_KEY

    params: dict[int, dict[str, Any]] = {}
    start = len(FAILURES)

    def call(logits: torch.Tensor, rows: list[int], payloads: list, histories: list) -> list[str]:
        custom: list[dict[str, Any] | None] = []
        for payload, history in zip(payloads, histories):
            p = params.setdefault(id(payload), {WIRE_KEY: encode_carried(payload)})
            p["__req__"] = SimpleNamespace(origin_input_ids=[2, 3], output_ids=list(history), eos_token_ids={EOS},
                                           kv=SimpleNamespace(kv_committed_len=2 + len(history)),
                                           sampling_params=SimpleNamespace(ignore_eos=False, stop_token_ids=None))
            custom.append(p)
        DynamoSglangLogitProcessor()(logits, custom)
        return list(FAILURES)[start:]

    call.failures = lambda: list(FAILURES)[start:]  # type: ignore[attr-defined]  # the driver reads its reports off the call
    return call


def _apply_rows_entry() -> Callable[..., list[str]]:
    report: list[str] = []
    realize = realizing(report)

    def call(logits: torch.Tensor, rows: list[int], payloads: list, histories: list) -> list[str]:
        sdk.drain()  # as an adapter on sdk.apply_rows does first in every call (dynlogits.sdk.readback)
        sdk.apply_rows(logits, rows, realize(logits, payloads, histories), histories)  # type: ignore[arg-type]  # every payload here realizes
        return report

    call.failures = lambda: list(report)  # type: ignore[attr-defined]  # the driver reads its reports off the call
    return call


ROW_ENGINES = {"tensorrt-llm": _trtllm_entry, "sglang": _sglang_entry, "sdk.apply_rows": _apply_rows_entry}


# -- a failure at the last step, and what the engine calls after it ------------------------------
#: What an engine may do after the step in which a request failed on the device (that request then
#: samples the stop token it was fail-stopped to, and the engine ends it):
#: ``apply``: more steps, on empty logits (``[0, vocab]``: nothing left to sample);
#: ``hosted``: more steps whose rows are all hosted requests (the resident path has no row);
#: ``calls``: no sampling at all, only batch bookkeeping (V1 ``update_state``, V2
#: ``apply_staged_writes``/``add_request``; a row-wise engine: another request's calls);
#: ``idle``: nothing at all.
AFTER = ("apply", "hosted", "calls", "idle")


def failure_then(sim: SimCuda, runner: str, after: str, *, settle_s: float = 10.0, lag: bool = False) -> list[str]:
    """One request whose forced token the grammar masks, alone (``runner``: ``v1``, ``v2`` or a
    ``ROW_ENGINES`` name), failing at the engine's last step for it; the device catches up, the
    engine does ``after`` three times, and the reports are read once nothing waits for the device
    (at most ``settle_s``). ``lag`` (V1): the engine removes the request before the device ran the
    failing step. Returns the failures reported."""
    if after not in AFTER:
        raise ValueError(f"after must be one of {AFTER}")
    quiet = logging.getLogger("dynlogits")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        if runner == "v1":
            reports = _failure_then_v1(sim, after, lag)
        elif runner == "v2":
            reports = _failure_then_v2(sim, after)
        else:
            reports = _failure_then_rows(sim, after, ROW_ENGINES[runner])
        INBOX.wait_settled(settle_s)
        return list(reports())
    finally:
        quiet.setLevel(level)


def _failure_then_v1(sim: SimCuda, after: str, lag: bool) -> Callable[[], Sequence[str]]:
    from vllm.v1.sample.logits_processor import BatchUpdateBuilder

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

    vocab = 64
    with sim.paused():
        processor = DynamoVllmLogitsProcessor(_v1_config(vocab, 8), sim.device, True)
    builder = BatchUpdateBuilder()
    output: list[int] = []
    builder.added.append((0, _params(FAILING), [2, 3], output))
    hosted: list[int] = []
    if after == "hosted":
        builder.added.append((1, _params(HOSTED), [2, 3], hosted))
    rows = 1 + (after == "hosted")
    gen = torch.Generator().manual_seed(0)
    processor.update_state(builder.get_and_reset(rows))
    logits = _logits(sim, rows, vocab, gen)
    _grammar(sim, logits, [0])
    processor.apply(logits)
    with sim.paused():
        sampled = _sampled(sim, logits)
        output.append(sampled[0])
        hosted.append(sampled[-1])
    if not lag:
        sim.advance()  # the device runs the failing step during the next forward
    if after != "idle":  # an idle engine schedules nothing: no batch update reaches the adapter either
        builder.removed_append(0)  # the request sampled its stop token: the scheduler ends it
        if after == "hosted":
            builder.moved.append((1, 0, _one_way()))
        processor.update_state(builder.get_and_reset(rows - 1))
    sim.advance()
    for _ in range(3):
        if after == "apply":
            processor.apply(_logits(sim, 0, vocab, gen))
        elif after == "hosted":
            logits = _logits(sim, 1, vocab, gen)
            processor.apply(logits)
            with sim.paused():
                hosted.append(_sampled(sim, logits)[0])
        elif after == "calls":
            processor.update_state(None)
        sim.advance()
    return lambda: processor.failures


def _one_way() -> Any:
    from vllm.v1.sample.logits_processor import MoveDirectionality

    return MoveDirectionality.UNIDIRECTIONAL


def _failure_then_v2(sim: SimCuda, after: str) -> Callable[[], Sequence[str]]:
    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.adapters.vllm.harness import V2SamplerHarness

    vocab = 64
    config = SimpleNamespace(speculative_config=None, use_v2_model_runner=True, model_config=None)
    with sim.paused():
        harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=vocab, max_num_reqs=4, max_model_len=64,
                                   vllm_config=config, device=sim.device, to_device=sim.wrap)
        failing, hosted = _params(FAILING), _params(HOSTED)
    processor = harness.processor
    harness_add(harness, sim, "fail", failing)
    batch = ["fail"]
    if after == "hosted":
        harness_add(harness, sim, "hosted", hosted)
        batch.append("hosted")
    gen = torch.Generator().manual_seed(0)
    processor.apply_staged_writes()
    with sim.paused():
        ctx = harness.context(batch, {})
    logits = _logits(sim, len(batch), vocab, gen)
    _grammar(sim, logits, [0])
    processor.apply(logits, ctx)
    with sim.paused():
        for q, token in zip(batch, _sampled(sim, logits)):
            harness.commit(q, [token])
        harness.remove_request("fail")  # it sampled its stop token: the scheduler ends it
    sim.advance()
    batch.remove("fail")
    for step in range(3):
        if after == "calls" and step == 1:  # a request without a payload arrives in the freed slot
            with sim.paused():
                plain = _params([])
            harness_add(harness, sim, "plain", plain)
        if after != "idle":
            processor.apply_staged_writes()
        if after in ("apply", "hosted"):
            with sim.paused():
                ctx = harness.context(batch, {})
            logits = _logits(sim, len(batch), vocab, gen)
            processor.apply(logits, ctx)
            with sim.paused():
                for q, token in zip(batch, _sampled(sim, logits)):
                    harness.commit(q, [token])
        sim.advance()
    return lambda: processor.failures


def _failure_then_rows(sim: SimCuda, after: str, engine: Callable[[], RowCall]) -> Callable[[], Sequence[str]]:
    vocab = 64
    entry = engine()
    gen = torch.Generator().manual_seed(0)
    other = builtin_payloads(vocab)[0]
    histories: list[list[int]]
    payloads, histories = ([FAILING, other], [[], []]) if after != "idle" else ([FAILING], [[]])
    logits = _logits(sim, len(payloads), vocab, gen)
    _grammar(sim, logits, [0])
    entry(logits, list(range(len(payloads))), payloads, histories)
    sim.advance()
    if after != "idle":  # the failing request has ended: only the other request's rows follow
        history = histories[1]
        for _ in range(3):
            logits = _logits(sim, 1, vocab, gen)
            entry(logits, [0], [other], [history])
            with sim.paused():
                history.append(_sampled(sim, logits)[0])
            sim.advance()
    return entry.failures  # type: ignore[attr-defined]  # set on the call by its engine builder
