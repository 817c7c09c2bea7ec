"""The ``micro`` suite: one decode step of each implementation on the same logits, side by side.

For each (vocab, kind, batch) every implementation gets the same requests (``workloads``):
``adapter`` (``DynamoVllmLogitsProcessor`` on the V1 interface, ``update_state(None)`` +
``apply(logits)``), ``adapter_v2`` (the same class through ``V2SamplerHarness``, ``apply(logits,
ctx)`` timed), ``loop`` (``sdk.apply_row`` per row), ``reference`` (ai-dynamo-runtime 1.6.1, per
row; forced_sequence only), ``floor`` (one ``fill_(-inf)`` of the rows; forced_sequence only),
``baseline`` (``adapter`` on banned_tokens requests of the same batch; banned_phrases,
no_repeat_ngram and dry only: their targets are ratios to banned_tokens, measured side by side so
the host's slow phases hit both), ``vllm_watermark`` (vLLM's own watermarker as its Model Runner V2
sampler calls it, one call for the batch: ``vllm_watermark.py``; watermark only).
``launches``/``syncs`` of the adapters come from ``drive.adapter_counts`` on the CUDA model.

Background compiles the warm-up queued (``COMPILER``) land before its last repetition. Each
repetition restores the logits, times the implementations in an order drawn anew (``run_order``:
what ran just before a step changes its time, so no implementation always follows the same one),
then grows every history by one token; medians after the warm-up are reported. The first repetition checks every
implementation against ``adapter`` (``reference``: same finite ids and argmax; ``vllm_watermark``: the
token it draws is, in every row, the one id the adapter leaves finite), else ``BenchmarkError``.
Every request samples at temperature 1.0 (vLLM's default, set explicitly: the watermark draws only
for sampling requests)."""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from dynlogits.kernels.variants import COMPILER
from dynlogits.testing.cuda.drive import CountError, adapter_counts

from . import workloads
from .models import bench_model_dir, eos_token_id, vllm_config
from .records import MicroRecord

__all__ = ["BenchmarkError", "MicroOptions", "run_micro", "run_order"]

T = TypeVar("T")


class BenchmarkError(RuntimeError):
    """An implementation produced different logits than the adapter: its timing would mean nothing."""


@dataclass(frozen=True)
class MicroOptions:
    kinds: Sequence[str] = workloads.KINDS
    batches: Sequence[int] = (1, 8, 64, 256)
    vocabs: Sequence[int] = (32000, 151936)
    repeats: int = 30
    warmup: int = 3
    prompt_len: int = 128
    device: str = "cpu"
    seed: int = 0
    #: the runner's ``max_model_len`` (the width of Model Runner V2's token matrix); ``None``: the
    #: history's length at the last step, so a kind that reads the matrix reads no empty columns
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.max_model_len is not None:
            need = max(history_len(kind, self) for kind in self.kinds)
            if self.max_model_len < need:
                raise ValueError(f"--max-model-len {self.max_model_len}: must hold every request's history at the "
                                 f"last step, at least {need} tokens here (prompt {self.prompt_len}, warm-up "
                                 f"{self.warmup}, {self.repeats} timed steps and the primed output)")


@dataclass
class _Case:
    """The requests of one measurement and their live histories (shared by the V1-style impls)."""

    kind: str
    vocab: int
    eos: int
    payloads: list[list[dict[str, Any]]]
    prompt: list[int]
    outputs: list[list[int]]
    #: request ``i``'s seed is ``seed + i`` (its payload's and its tokens')
    seed: int = 0

    def params(self, i: int) -> Any:
        from vllm import SamplingParams

        from dynlogits.specs import WIRE_KEY

        params = SamplingParams(temperature=TEMPERATURE, extra_args={WIRE_KEY: self.payloads[i]})
        params.update_from_generation_config({}, self.eos)  # as the engine does from the model's config
        return params

    def next_tokens(self) -> list[int]:
        return [workloads.next_token(p, len(o), vocab_size=self.vocab, seed=self.seed + i)
                for i, (p, o) in enumerate(zip(self.payloads, self.outputs))]


#: The longest the last warm-up repetition waits for the compiles the earlier ones queued
#: (``dynlogits.kernels.variants.COMPILER``: Triton variants, ``dry``'s native host step), so the
#: timed repetitions see the steady state an engine reaches after its first steps.
COMPILE_WAIT_S = 120.0
#: What every request samples at (vLLM's default).
TEMPERATURE = 1.0
#: The largest batch vLLM's own (CPU) watermarker is timed at: its target is at batch 64.
VLLM_WATERMARK_MAX_BATCH = 64
#: Kinds whose target is a ratio to another kind's adapter: that kind, timed in the same loop (``baseline``).
BASELINES = {"banned_phrases": "banned_tokens", "no_repeat_ngram": "banned_tokens", "dry": "banned_tokens"}


def _max_num_seqs(batch: int) -> int:
    """The engine's scheduling limit for a batch: at least the batch (vLLM never runs more rows),
    256 below that so every batch size shares one config."""
    return max(256, batch)


class _Impl(ABC):
    name: str

    def advance(self, tokens: Sequence[int]) -> None:  # noqa: B027 - an optional hook, empty by default
        """The step's new tokens (one per request), for impls that keep their own history."""

    def before(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Untimed work the runner does before calling the processor (e.g. V2's context)."""

    def drawn(self) -> torch.Tensor | None:
        """The tokens the last step sampled, for impls that sample instead of processing logits."""
        return None

    @abstractmethod
    def step(self, logits: torch.Tensor) -> None:
        """The timed step, in place."""


class _V1Processor(_Impl):
    """A V1-interface processor class fed every request once by vLLM's ``BatchUpdateBuilder``."""

    def __init__(self, name: str, cls: type, case: _Case, device: torch.device) -> None:
        from vllm.v1.sample.logits_processor import BatchUpdateBuilder

        self.name = name
        self.processor = cls(vllm_config(case.vocab, _max_num_seqs(len(case.outputs))), device, device.type == "cuda")
        builder = BatchUpdateBuilder()
        for i, output in enumerate(case.outputs):
            builder.added.append((i, case.params(i), list(case.prompt), output))
        self.processor.update_state(builder.get_and_reset(len(case.outputs)))

    def step(self, logits: torch.Tensor) -> None:
        self.processor.update_state(None)  # steady state: no batch change
        self.processor.apply(logits)


class _V2Adapter(_Impl):
    name = "adapter_v2"

    def __init__(self, case: _Case, max_model_len: int) -> None:
        from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
        from dynlogits.adapters.vllm.harness import V2SamplerHarness

        self.harness = V2SamplerHarness(DynamoVllmLogitsProcessor, vocab_size=case.vocab,
                                        max_num_reqs=len(case.payloads), max_model_len=max_model_len,
                                        vllm_config=vllm_config(case.vocab, _max_num_seqs(len(case.outputs))))
        self.ids = [f"r{i}" for i in range(len(case.payloads))]
        for i, req_id in enumerate(self.ids):
            self.harness.add_request(req_id, case.prompt, case.params(i), output_ids=case.outputs[i])
        self.ctx: Any = None

    def advance(self, tokens: Sequence[int]) -> None:  # noqa: B027 - an optional hook, empty by default
        for req_id, token in zip(self.ids, tokens):
            self.harness.commit(req_id, [token])

    def before(self) -> None:
        self.ctx = self.harness.context(self.ids, {})

    def step(self, logits: torch.Tensor) -> None:
        self.harness.processor.apply(logits, self.ctx)


class _Loop(_Impl):
    name = "loop"

    def __init__(self, case: _Case) -> None:
        from dynlogits import sdk
        from dynlogits.processors.sampling import SamplingView

        stop = sdk.pick_stop_token(case.eos, None, case.vocab)
        realized = [sdk.realize(p, vocab_size=case.vocab, stop_token_id=stop,
                                facts=sdk.RequestFacts.of(prompt_ids=case.prompt, eos_token_id=case.eos,
                                                          sampling=SamplingView.read(case.params(i))))
                    for i, p in enumerate(case.payloads)]
        self.requests = [r for r in realized if r is not None]
        if len(self.requests) != len(realized):
            raise ValueError("every micro payload realizes to a request (one has no entries)")
        self.outputs = case.outputs
        self.apply_row = sdk.apply_row

    def step(self, logits: torch.Tensor) -> None:
        for i, request in enumerate(self.requests):
            self.apply_row(request, self.outputs[i], logits[i])


class _VllmWatermark(_Impl):
    name = "vllm_watermark"

    def __init__(self, case: _Case, max_model_len: int) -> None:
        from .vllm_watermark import NativeWatermarker

        entry = case.payloads[0][-1]
        self.native = NativeWatermarker(int(entry["key"]), int(entry["context_width"]),
                                        prompts=[case.prompt] * len(case.outputs), outputs=case.outputs,
                                        temperatures=[TEMPERATURE] * len(case.outputs), max_model_len=max_model_len)

    def advance(self, tokens: Sequence[int]) -> None:
        self.native.advance(tokens)

    def step(self, logits: torch.Tensor) -> None:
        self.native.step(logits)

    def drawn(self) -> torch.Tensor | None:
        return self.native.tokens


class _Floor(_Impl):
    name = "floor"

    def step(self, logits: torch.Tensor) -> None:
        logits.fill_(-math.inf)


def history_len(kind: str, opts: MicroOptions) -> int:
    """How many tokens a request of ``kind`` holds at the last step of a measurement (prompt, primed
    output, warm-up and timed steps, and the token a step's draw appends)."""
    return opts.prompt_len + workloads.PRIMED.get(kind, 0) + opts.warmup + opts.repeats + 1


def _impls(case: _Case, opts: MicroOptions, device: torch.device, skipped: set[str]) -> list[_Impl]:
    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor

    from .reference import ReferenceForcedSequenceProcessor, reference_available

    impls: list[_Impl] = [_V1Processor("adapter", DynamoVllmLogitsProcessor, case, device)]
    max_model_len = history_len(case.kind, opts) if opts.max_model_len is None else opts.max_model_len
    if device.type == "cpu":
        impls.append(_V2Adapter(case, max_model_len))
    else:
        skipped.add("adapter_v2: the Model Runner V2 harness is CPU-only (plain host tensors stand in for its buffers)")
    impls.append(_Loop(case))
    if case.kind == "forced_sequence":
        why = reference_available()
        if why is None:
            impls.append(_V1Processor("reference", ReferenceForcedSequenceProcessor, case, device))
        else:
            skipped.add(f"reference: {why}")
        impls.append(_Floor())
    if case.kind == "watermark":
        if len(case.outputs) > VLLM_WATERMARK_MAX_BATCH:
            skipped.add(f"vllm_watermark: timed up to batch {VLLM_WATERMARK_MAX_BATCH}, where its target is (one CPU "
                        "call took 11-20 s at batch 64 here: a larger batch would hold the suite for minutes)")
        elif device.type == "cpu":
            impls.append(_VllmWatermark(case, max_model_len))
        else:
            skipped.add("vllm_watermark: its stand-in runner state is on the host (on CUDA vLLM runs its Triton kernel)")
    if case.kind in BASELINES:
        kind = BASELINES[case.kind]
        payloads = [workloads.payload(kind, vocab_size=case.vocab, eos_token_id=case.eos, seed=opts.seed + i)
                    for i in range(len(case.payloads))]
        baseline = _Case(kind, case.vocab, case.eos, payloads, case.prompt, outputs=[[] for _ in payloads],
                         seed=opts.seed)
        impls.append(_V1Processor("baseline", DynamoVllmLogitsProcessor, baseline, device))
    return impls


def _check_draw(tokens: torch.Tensor | None, want: torch.Tensor) -> str | None:
    """Why vLLM's drawn ``tokens`` differ from the ids the adapter forced in ``want``, or ``None``."""
    if tokens is None:
        return "no tokens drawn"
    finite = torch.isfinite(want).sum(dim=-1)
    if not bool((finite == 1).all()):
        return f"the adapter left {finite.tolist()} finite ids per row, not one (a row not watermarked)"
    forced = want.argmax(dim=-1)
    if not torch.equal(tokens.to(forced.dtype), forced):
        bad = (tokens.to(forced.dtype) != forced).nonzero().flatten()[:3].tolist()
        return f"a different token in rows {bad}"
    return None


def _check(impl: str, got: torch.Tensor, want: torch.Tensor, drawn: torch.Tensor | None = None) -> str | None:
    """Why ``got`` (after ``impl``) differs from the adapter's ``want``, or ``None``; for
    ``vllm_watermark``, which samples, why the tokens it ``drawn`` differ from those the adapter forced."""
    if impl == "vllm_watermark":
        return _check_draw(drawn, want)
    if impl in ("floor", "baseline"):  # other work by design (baseline: checked in its own kind's runs)
        return None
    if impl == "reference":  # keeps the forced token's own logit where the adapter writes 0.0
        if not torch.equal(torch.isfinite(got), torch.isfinite(want)):
            return "a different set of finite logits"
        if not torch.equal(got.argmax(dim=-1), want.argmax(dim=-1)):
            return "a different argmax"
        return None
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True):
        bad = (~torch.isclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)).nonzero()[:3].tolist()
        return f"different logits at [row, id] {bad}"
    return None


def run_order(impls: Sequence[T], rep: int, rng: random.Random) -> list[T]:
    """The order repetition ``rep`` times ``impls`` in: list order first (the adapter, whose logits
    the others are checked against), then a permutation drawn from ``rng``. What ran just before a
    step changes its time (docs/performance.md), and a rotated order has each implementation follow
    the same one nearly every time, which biases a ratio; a drawn order lets each follow every other
    alike."""
    return list(impls) if rep == 0 else rng.sample(list(impls), len(impls))


def _measure(case: _Case, impls: list[_Impl], pristine: torch.Tensor, opts: MicroOptions,
             sync: Callable[[], None]) -> dict[str, list[float]]:
    logits = torch.empty_like(pristine)
    times: dict[str, list[float]] = {impl.name: [] for impl in impls}
    rng = random.Random(opts.seed)
    for rep in range(opts.warmup + opts.repeats):
        if rep == max(opts.warmup - 1, 0):  # what the warm-up queued compiles now, as after an engine's load
            COMPILER.join(timeout=COMPILE_WAIT_S)
        expected: torch.Tensor | None = None
        for impl in run_order(impls, rep, rng):
            logits.copy_(pristine)
            impl.before()
            sync()
            start = time.perf_counter_ns()
            impl.step(logits)
            sync()
            elapsed_ms = (time.perf_counter_ns() - start) / 1e6
            if rep == 0:  # impls run in list order: the adapter first
                if expected is None:
                    expected = logits.clone()
                elif (why := _check(impl.name, logits, expected, impl.drawn())) is not None:
                    raise BenchmarkError(f"{impl.name} disagrees with the adapter on {case.kind}, batch "
                                         f"{len(case.outputs)}, vocab {case.vocab}: {why}")
            if rep >= opts.warmup:
                times[impl.name].append(elapsed_ms)
        tokens = case.next_tokens()  # the step's sampled tokens join every history
        for output, token in zip(case.outputs, tokens):
            output.append(token)
        for impl in impls:
            impl.advance(tokens)
    return times


def _sync_for(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def run_micro(opts: MicroOptions, *, progress: Callable[[str], None] | None = None) -> tuple[list[MicroRecord], list[str]]:
    """Measure every (vocab, kind, batch) of ``opts``; returns the records and notes on what was skipped."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    device = torch.device(opts.device)
    sync = _sync_for(device)
    records: list[MicroRecord] = []
    skipped: set[str] = set()
    for vocab in opts.vocabs:
        eos = eos_token_id(bench_model_dir(vocab))
        for max_num_seqs in {_max_num_seqs(b) for b in opts.batches}:
            vllm_config(vocab, max_num_seqs)  # built once per width, outside every measurement
        for kind in opts.kinds:
            for batch in opts.batches:
                say(f"[micro] vocab {vocab}, {kind}, batch {batch}")
                case = _Case(kind, vocab, eos,
                             payloads=[workloads.payload(kind, vocab_size=vocab, eos_token_id=eos, seed=opts.seed + i)
                                       for i in range(batch)],
                             prompt=[vocab - 1] * opts.prompt_len, outputs=[[] for _ in range(batch)], seed=opts.seed)
                for _ in range(workloads.PRIMED.get(kind, 0)):  # histories that already repeat
                    for output, token in zip(case.outputs, case.next_tokens()):
                        output.append(token)
                impls = _impls(case, opts, device, skipped)
                gen = torch.Generator().manual_seed(opts.seed)
                pristine = torch.randn(batch, vocab, generator=gen).to(device)
                for impl, times in _measure(case, impls, pristine, opts, sync).items():
                    launches = syncs = None
                    if impl in ("adapter", "adapter_v2"):  # counted on the CUDA model, whatever the device
                        try:
                            launches, syncs = adapter_counts(impl, vocab, case.payloads,
                                                             repeating=kind in workloads.PRIMED)
                        except CountError as exc:
                            skipped.add(f"launches/syncs of {kind}: {exc}")
                    records.append(MicroRecord(kind=kind, batch=batch, vocab=vocab, impl=impl,
                                               median_ms=statistics.median(times), launches=launches, syncs=syncs,
                                               rep_ms=tuple(times)))
    return records, sorted(skipped)
