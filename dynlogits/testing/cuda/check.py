"""The apply path on a real CUDA device: syncs, landed copies, failure reports and cost, where a CPU
cannot see them.

``python -m dynlogits.testing.cuda.check [--json FILE]`` (a GPU, torch, numpy, pydantic, msgspec;
no engine) drives ``SlotBatch`` as the vLLM V1 adapter does and ``sdk.apply_rows`` for hosted rows,
making only calls an engine makes (no ``synchronize``, extra ``apply`` or poll); once idle it waits
on the host (``INBOX.wait_settled``) and counts the reports. Checks, printed and in ``--json``:

* ``syncs``: every adapter call under ``torch.cuda.set_sync_debug_mode("warn")`` and the profiler;
* ``landed``: a 40-step sequence with the device kept behind the host; every step's logits equal
  the CPU run's bit for bit (fp32, bf16) and both grammar-masked requests are reported;
* ``failures``: a failing last step then each of ``AFTER``, reported once, no sync; each of
  ``MUTANTS`` must miss its failure;
* ``cost``: steady-step time and device ops of the resident path, ``loop`` and the memset ``floor``;
* ``watermark``: the compiled Gumbel-max draw against the eager and the CPU draws bit for bit, its
  device ops, no sync, its time (``watermark_check``; ``--watermark-only`` runs this section alone,
  ``python -m dynlogits.testing.cuda.watermark_check --cpu`` is its CPU self test); the fused Triton
  kernels against eager on the GPU (bits, kernel count, no sync, time: ``watermark_check.run_fused``);
  ``--cpu`` runs only those kernels in Triton's interpreter (bits, no GPU);
* ``kernels``: every other kind's fused Triton kernels (``KERNEL_CHECKS``: ``no_repeat_ngram_check``,
  ``dry_check``, ``spans_check``, ``banned_phrases_check``, ``forced_check``, ``dead_rows_check``,
  ``multiple_choice_check``)
  against their eager paths on the GPU (bits, device ops, no sync, time), each module's ``run``;
  ``--kernels-only`` runs this section alone; ``--cpu`` runs each one's CPU self test as well (the
  kernels in Triton's interpreter).

Exit status: 0 when every check passed, 1 otherwise, 2 without CUDA. Details: docs/vllm.md."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynlogits import sdk
from dynlogits.sdk.readback import INBOX
from dynlogits.sdk.resident.engine_step import EngineStep

from . import watermark_check
from .drive import AFTER, EOS, FAILING, GRAMMAR_MASKED, HOSTED, builtin_payloads
from .timing import timed

NO_TOKEN_LEFT = "no token left to sample"
LAG_CYCLES = 2_000_000  # about 1 ms of GPU time queued ahead of each step's adapter calls
SETTLE_S = 10.0  # how long an idle engine gives the watcher to report what landed


@dataclass
class _Row:
    request: sdk.GuardedRequest
    tokens: list[int]
    slot: int | None
    failing: bool
    first_step: int


@dataclass
class SequenceRun:
    """One run of the sequence: each step's processed logits (on the host) and what it saw."""

    logits: list[torch.Tensor] = field(default_factory=list)
    rows: list[list[int | None]] = field(default_factory=list)  # per step: request id of each row
    failures: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # per step: the sampled token of each row
    failing: dict[int, int] = field(default_factory=dict)  # request id -> the step its grammar fails it


class _Engine:
    """A V1-runner-like engine loop around ``SlotBatch`` and ``apply_rows`` (see the module doc)."""

    def __init__(self, device: torch.device, vocab: int, num_slots: int, check: bool) -> None:
        self.device, self.vocab, self.check = device, vocab, check
        self.batch = sdk.SlotBatch(num_slots=num_slots, vocab_size=vocab, device=device, host_histories=True)
        self.free = list(range(num_slots - 1, -1, -1))
        self.rows: list[_Row | None] = []
        self.ids: list[int | None] = []
        self.report: list[str] = []
        self.syncs: list[str] = []
        self.next_id = 0
        self.failing: dict[int, int] = {}

    @contextmanager
    def adapter(self) -> Iterator[None]:
        """The adapter's calls: CUDA's sync accounting on (``warn``), each warning recorded."""
        if not self.check:
            yield
            return
        event_class = torch.cuda.Event
        real_synchronize = event_class.synchronize

        def watched(event: Any) -> None:  # CUDA's accounting does not cover cudaEventSynchronize
            if not event.query():
                where = [f for f in traceback.extract_stack() if "/dynlogits/" in f.filename and f.name != "watched"]
                self.syncs.append(f"{where[-1].filename}:{where[-1].lineno}: Event.synchronize on a pending event"
                                  if where else "Event.synchronize on a pending event")
            real_synchronize(event)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            event_class.synchronize = watched  # type: ignore[method-assign,assignment]  # watched: a plain function taking the event
            try:
                yield
            finally:
                event_class.synchronize = real_synchronize  # type: ignore[method-assign]  # the method put back
                torch.cuda.set_sync_debug_mode("default")
        self.syncs += [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "synchroniz" in str(w.message)]

    def admit(self, row: int, payload: list[dict[str, Any]], stop: int | None, step: int) -> None:
        with self.adapter():
            sdk.drain()  # first in every adapter call, as adapters/vllm/v1.py's update_state does
            request = sdk.realize(payload, vocab_size=self.vocab, stop_token_id=stop, report=self.report.append)
            assert request is not None
            slot = None
            if request.resident and self.free:
                slot = self.free.pop()
                self.batch.assign(slot, request)
        while len(self.rows) <= row:
            self.rows.append(None)
            self.ids.append(None)
        self.remove(row)
        self.rows[row] = _Row(request, [], slot, payload is FAILING, step)
        self.ids[row] = self.next_id
        if payload is FAILING:
            self.failing[self.next_id] = step
        self.next_id += 1

    def remove(self, row: int) -> None:
        entry = self.rows[row]
        if entry is not None:
            with self.adapter():
                sdk.drain()
                if entry.slot is not None:
                    self.batch.assign(entry.slot, None)
            if entry.slot is not None:
                self.free.append(entry.slot)
        self.rows[row], self.ids[row] = None, None

    def swap(self, a: int, b: int) -> None:
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        self.ids[a], self.ids[b] = self.ids[b], self.ids[a]

    def relayout(self) -> None:
        slots = np.array([-1 if r is None or r.slot is None else r.slot for r in self.rows], dtype=np.int64)
        with self.adapter():
            sdk.drain()
            self.batch.set_rows(slots)
            self.batch.flush()

    def apply(self, logits: torch.Tensor) -> None:
        """One step, as ``adapters/vllm/v1.py``'s ``apply``: drain, then the resident path only when
        a row is resident and the hosted path only when one is hosted."""
        histories = [[] if r is None else r.tokens for r in self.rows]
        hosted = [i for i, r in enumerate(self.rows) if r is not None and r.slot is None]
        with self.adapter():
            sdk.drain()
            if any(r is not None and r.slot is not None for r in self.rows):
                self.batch.apply(logits, EngineStep(histories=histories))
            if hosted:
                sdk.apply_rows(logits, hosted, [self.rows[i].request for i in hosted],  # type: ignore[union-attr]  # hosted rows are occupied
                               [histories[i] for i in hosted])


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The engine's logits for a step: from pinned memory, without blocking (never counted)."""
    if device.type != "cuda":
        return host.clone()
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class DeviceModel:
    """How a sequence treats a device that is not a GPU (the CUDA model: ``SimCuda.put``,
    ``advance`` and ``value``): ``put`` a host tensor there as the engine's logits, let the device
    ``catch_up`` with what was queued (a GPU does it on its own, during the engine's forward), and
    read a ``value`` back for the comparison (never counted)."""

    put: Callable[[torch.Tensor], torch.Tensor]
    catch_up: Callable[[], None]
    value: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.cpu


def run_sequence(device: torch.device, *, dtype: torch.dtype, replay: SequenceRun | None,
                 steps: int = 40, vocab: int = 64, seed: int = 0, lag: bool = False,
                 model: DeviceModel | None = None) -> SequenceRun:
    """The sequence on ``device``. ``replay``: take each step's tokens from that run (no read back
    from the device, as when the host runs ahead); else sample greedily here (the reference)."""
    check = device.type == "cuda"
    engine = _Engine(device, vocab, num_slots=24, check=check)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    kinds = builtin_payloads(vocab)
    out = SequenceRun()
    kept: list[torch.Tensor] = []
    os.environ.setdefault("DYN_LOGITS_PYTHON_FACTORIES", "dynlogits.testing.faults:scale")
    for i in range(12):
        engine.admit(i, kinds[i % len(kinds)], EOS, 0)
    for step in range(steps):
        changed = step == 0
        live = [i for i, r in enumerate(engine.rows) if r is not None]
        if step == 1:
            engine.admit(len(engine.rows), FAILING, EOS, step)
            engine.admit(len(engine.rows), FAILING, None, step)  # no stop token: fail-stopped to the pick
            engine.remove(1)
            changed = True
        elif step == 2:
            engine.swap(0, 2)
            changed = True
        elif step == 5:
            engine.admit(len(engine.rows), HOSTED, EOS, step)
            changed = True
        elif step > 7:
            roll = rng.random()
            ordinary = [i for i in live if not engine.rows[i].failing]  # type: ignore[union-attr]  # live rows are occupied
            if roll < 0.35 and len(ordinary) > 4:
                engine.remove(rng.choice(ordinary))
                changed = True
            elif roll < 0.7:
                holes = [i for i, r in enumerate(engine.rows) if r is None]
                row = rng.choice(holes) if holes and rng.random() < 0.5 else len(engine.rows)
                engine.admit(row, kinds[rng.randrange(len(kinds))], EOS, step)
                changed = True
            elif roll < 0.85 and len(live) > 2:
                a, b = rng.sample(live, 2)
                engine.swap(a, b)
                changed = True
        if changed:
            engine.relayout()
        host = torch.randn(len(engine.rows), vocab, generator=gen).to(dtype)
        for i, r in enumerate(engine.rows):
            if r is not None and r.failing:
                host[i, GRAMMAR_MASKED] = -math.inf  # the engine's grammar bitmask
        if model is not None:
            model.catch_up()  # the device ran the last step during this step's forward
        logits = model.put(host) if model is not None else _upload(host, device)
        if lag:
            torch.cuda._sleep(LAG_CYCLES)
        engine.apply(logits)
        kept.append(logits)
        out.rows.append(list(engine.ids))
        if replay is None:
            tokens = logits.float().argmax(dim=-1).tolist()
        else:
            tokens = replay.tokens[step]
        out.tokens.append(tokens)
        finished = []
        for i, (r, t) in enumerate(zip(engine.rows, tokens)):
            if r is not None:
                r.tokens.append(t)
                if r.request.stop_token_id is not None and t == r.request.stop_token_id:
                    finished.append(i)
        for i in finished:  # the engine ends a request that sampled its stop token
            engine.remove(i)
        if finished:
            engine.relayout()
    if model is not None:
        model.catch_up()
    INBOX.wait_settled(SETTLE_S)  # the engine goes idle: the watcher reads what lands (no adapter call)
    out.logits = [model.value(t) if model is not None else t.cpu() for t in kept]
    out.failures = list(engine.report)
    out.syncs = engine.syncs
    out.failing = dict(engine.failing)
    return out


def compare(reference: SequenceRun, got: SequenceRun) -> list[str]:
    """Rows that differ bit for bit; a failing request is compared at its first step only (its
    later rows depend on when the host learns of the failure, by design)."""
    diffs = []
    if len(reference.logits) != len(got.logits) or reference.rows != got.rows:
        return ["the two runs did not see the same batches"]
    for step, (want, have, ids) in enumerate(zip(reference.logits, got.logits, reference.rows)):
        for row, rid in enumerate(ids):
            if rid is None or step > reference.failing.get(rid, step):
                continue
            if not torch.equal(want[row], have[row]):
                bad = (want[row] != have[row]).nonzero().flatten().tolist()[:5]
                diffs.append(f"step {step} row {row} (request {rid}): differs at ids {bad}")
    return diffs


# -- a failure at the last step -------------------------------------------------------------------
def run_failure(device: torch.device, after: str, *, hosted: bool, lag: bool = True,
                model: DeviceModel | None = None, settle_s: float = SETTLE_S) -> tuple[list[str], list[str]]:
    """One request whose forced token the grammar masks, resident or ``hosted`` (a ``python`` entry
    beside it), failing at its last step; the engine removes it, then does ``after``
    (``drive.AFTER``) three times, with the device kept ``lag`` behind and nothing read, synchronized
    or polled. Returns the failures reported and the syncs seen in the adapter's calls. ``model``:
    the CUDA model (``SimCuda.put``, ``SimCuda.advance``) instead of a GPU."""
    check = device.type == "cuda"
    put = model.put if model is not None else (lambda host: _upload(host, device))
    catch_up = model.catch_up if model is not None else (lambda: None)
    engine = _Engine(device, 64, num_slots=4, check=check)
    gen = torch.Generator().manual_seed(1)
    engine.admit(0, FAILING + HOSTED if hosted else FAILING, EOS, 0)
    if after == "hosted":
        engine.admit(1, HOSTED, EOS, 0)
    engine.relayout()
    host = torch.randn(len(engine.rows), 64, generator=gen)
    host[0, GRAMMAR_MASKED] = -math.inf
    if lag and check:
        torch.cuda._sleep(LAG_CYCLES)
    engine.apply(put(host))
    for r in engine.rows:  # what was sampled (known without reading the device: the stop token, and any)
        if r is not None:
            r.tokens.append(EOS)
    catch_up()
    if after != "idle":  # the failing request sampled its stop token: the engine ends it
        engine.remove(0)
        engine.relayout()
    for _ in range(3):
        if lag and check:
            torch.cuda._sleep(LAG_CYCLES)
        if after == "apply":
            engine.apply(put(torch.zeros(0, 64)))
        elif after == "hosted":
            engine.apply(put(torch.randn(len(engine.rows), 64, generator=gen)))
            engine.rows[1].tokens.append(5)  # type: ignore[union-attr]  # row 1 is occupied here
        elif after == "calls":
            engine.relayout()
        catch_up()
    INBOX.wait_settled(settle_s)
    return list(engine.report), list(engine.syncs)


@contextmanager
def mutant(name: str) -> Iterator[None]:
    """A defect the failure sequences must catch: ``no_watcher`` (nothing reads for an idle
    engine), ``apply_only`` (flags read only by a later apply: adapters' other calls do not drain)."""
    watching = INBOX.watching
    INBOX.watching = False
    if name == "apply_only":
        INBOX.drain = lambda: 0  # type: ignore[method-assign]  # a stand-in for this measurement only
    try:
        yield
    finally:
        INBOX.watching = watching
        if name == "apply_only":
            del INBOX.drain


#: Each mutant, and the sequence (``after``) that must then miss the failure.
MUTANTS = {"no_watcher": "idle", "apply_only": "calls"}


def failure_checks(device: torch.device, model: DeviceModel | None = None) -> list[dict[str, Any]]:
    """Every failure sequence (resident and hosted, each ``after``) must report exactly one failure
    with no sync; under each mutant its sequence must report none."""
    results = []
    for hosted in (False, True):
        for after in AFTER:
            reports, syncs = run_failure(device, after, hosted=hosted, model=model)
            reported = sum(NO_TOKEN_LEFT in f for f in reports)
            results.append({"sequence": f"{'hosted' if hosted else 'resident'}, then {after}", "reported": reported,
                            "syncs": syncs, "ok": reported == 1 and not syncs})
        for name, after in MUTANTS.items():
            with mutant(name):
                # what lands is read within a few watcher periods; a mutant reads nothing however long
                reports, _ = run_failure(device, after, hosted=hosted, model=model, settle_s=20 * INBOX.period)
            caught = not reports
            results.append({"sequence": f"mutant {name} ({'hosted' if hosted else 'resident'}, then {after})",
                            "reported": len(reports), "syncs": [], "ok": caught})
    return results


# -- cost -----------------------------------------------------------------------------------------
KIND_PAYLOADS: dict[str, Callable[[int, int], list[dict[str, Any]]]] = {
    "forced_sequence": lambda v, i: [{"kind": "forced_sequence", "token_ids": [(7 * i + j) % (v - 2) + 2 for j in range(64)],
                                      "eos_token_id": EOS}],
    "banned_tokens": lambda v, i: [{"kind": "banned_tokens", "token_ids": [(97 * i + 13 * j) % (v - 2) + 2 for j in range(32)]}],
    "logit_bias": lambda v, i: [{"kind": "logit_bias", "bias": {str((89 * i + 11 * j) % (v - 2) + 2): 1.5 for j in range(32)}}],
}


def _mixed(v: int, i: int) -> list[dict[str, Any]]:
    return KIND_PAYLOADS[sorted(KIND_PAYLOADS)[i % len(KIND_PAYLOADS)]](v, i)


@dataclass
class Cost:
    kind: str
    batch: int
    impl: str
    wall_ms: float  # per step, host wall clock over the loop to a final synchronize
    device_ms: float  # per step, CUDA events around the loop
    ops: float  # device ops (kernels, copies, memsets) per step, from the profiler trace
    pageable: int  # pageable host-to-device copies per step
    names: list[str] = field(default_factory=list)  # the device ops of one step (the trace's names)


def _device_ops(fn: Callable[[], object], steps: int, trace_dir: Path) -> tuple[float, int, list[str]]:
    """Device ops per step, pageable copies in all, and the names of one step's ops (from the trace)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    path = trace_dir / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text()).get("traceEvents", [])
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    pageable = sum("Pageable" in e.get("name", "") for e in device)
    return len(device) / steps, pageable, [e.get("name", "")[:90] for e in device[: len(device) // steps]]


def measure(kind: str, batch: int, *, vocab: int, steps: int, trace_dir: Path) -> list[Cost]:
    device = torch.device("cuda")
    make = _mixed if kind == "mixed" else {**KIND_PAYLOADS, **watermark_check.PAYLOADS}[kind]
    payloads = [make(vocab, i) for i in range(batch)]
    facts = sdk.RequestFacts(sampling=watermark_check.SAMPLING) if kind in watermark_check.PAYLOADS else None
    histories: list[list[int]] = [[5] * 3 for _ in range(batch)]  # position 3: a forced row stays forced
    stop = sdk.pick_stop_token(EOS, None, vocab)
    logits = torch.randn(batch, vocab, device=device)

    def resident() -> sdk.SlotBatch:
        slots = sdk.SlotBatch(num_slots=max(256, batch), vocab_size=vocab, device=device, host_histories=True)
        for i, p in enumerate(payloads):
            request = sdk.realize(p, vocab_size=vocab, stop_token_id=stop, facts=facts)
            assert request is not None
            slots.assign(i, request)
        slots.set_rows(np.arange(batch, dtype=np.int64))
        slots.flush()
        return slots

    masking = resident()
    loop_requests = [sdk.realize(p, vocab_size=vocab, stop_token_id=stop, facts=facts) for p in payloads]

    def loop() -> None:
        for i, request in enumerate(loop_requests):
            sdk.apply_row(request, histories[i], logits[i])  # type: ignore[arg-type]  # every loop request was realized

    impls: dict[str, Callable[[], object]] = {"adapter": lambda: masking.apply(logits, EngineStep(histories=histories))}
    impls["loop"] = loop
    if kind == "forced_sequence":
        impls["floor"] = lambda: logits.fill_(-math.inf)
    costs = []
    for name, fn in impls.items():
        n = steps if name != "loop" or batch <= 64 else max(5, steps // 10)
        wall, device_ms = timed(fn, n, warmup=5)
        ops, pageable, names = _device_ops(fn, min(n, 10), trace_dir)
        costs.append(Cost(kind, batch, name, wall, device_ms, ops, pageable, names if name.startswith("adapter") else []))
    return costs


def _detectors_see_planted_syncs(device: torch.device) -> dict[str, bool]:
    """Whether each detector sees what it is for: an ``.item()``, a wait on a pending event and a
    number written into one element inside an adapter call are recorded; a number written into a
    row is not (the rule ``dynlogits.testing.cuda.simcuda`` models); a pageable copy is in the trace."""
    seen = {}
    t = torch.zeros(4, 8, device=device)
    planted: dict[str, Callable[[], object]] = {
        "item": lambda: t[0, 0].item(),
        "pending event": lambda: (torch.cuda._sleep(LAG_CYCLES), _recorded().synchronize()),
        "number into one element": lambda: t.__setitem__((0, 1), 2.0),
        "number into a row (not a sync)": lambda: t.__setitem__(1, 2.0),
    }
    for name, plant in planted.items():
        engine = _Engine(device, 64, num_slots=2, check=True)
        torch.cuda.synchronize()
        with engine.adapter():
            plant()
        seen[name] = bool(engine.syncs)
    with tempfile.TemporaryDirectory() as tmp:
        _, pageable, _ = _device_ops(lambda: torch.ones(1024).to(device, non_blocking=True), 1, Path(tmp))
    seen["pageable copy"] = pageable == 1
    return seen


def _recorded() -> Any:
    event = torch.cuda.Event()
    event.record()
    return event


def _watermark_costs(vocab: int, steps: int) -> list[dict[str, Any]]:
    """The resident V1 steady step of every ``watermark_check.PAYLOADS`` kind (compiled draw), printed
    as the cost table's rows (its ops: the step's, the compiled kernels included; not judged)."""
    costs = []
    print(f"\n{'kind':<16}{'batch':>6}  {'impl':<19}{'wall ms':>10}{'device ms':>11}{'ops':>7}{'pageable':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in watermark_check.PAYLOADS:
            for batch in (1, 64, 256):
                for c in measure(kind, batch, vocab=vocab, steps=steps, trace_dir=Path(tmp)):
                    costs.append(asdict(c))
                    print(f"{c.kind:<16}{c.batch:>6}  {c.impl:<19}{c.wall_ms:>10.4f}{c.device_ms:>11.4f}"
                          f"{c.ops:>7.1f}{c.pageable:>9}", flush=True)
                    if c.impl == "adapter":
                        print(f"    {c.names}", flush=True)
    return costs


#: every kind's GPU check of its fused kernels besides the watermark's: module name under
#: ``dynlogits.testing.cuda`` -> (its GPU ``run``'s name, its CPU self test's name)
KERNEL_CHECKS: dict[str, tuple[str, str]] = {
    "no_repeat_ngram_check": ("run", "interpreted_check"),
    "dry_check": ("run", "cpu_check"),
    "spans_check": ("run", "cpu_check"),
    "banned_phrases_check": ("run", "interpreted_check"),
    "forced_check": ("run", "cpu_check"),
    "dead_rows_check": ("run", "cpu_check"),
    "multiple_choice_check": ("run", "cpu_check"),
}


def _kernel_checks(device: torch.device | None) -> tuple[bool, dict[str, Any]]:
    """``KERNEL_CHECKS`` on ``device`` (``None``: each CPU self test), each result under its name."""
    import importlib

    ok, results = True, {}
    for name, (run, cpu) in KERNEL_CHECKS.items():
        module = importlib.import_module(f"{__package__}.{name}")
        print(f"\n== {name} ==", flush=True)
        if device is None:
            good, detail = bool(getattr(module, cpu)()), {}
        else:
            good, detail = getattr(module, run)(device)
        results[name] = {"ok": good, **detail}
        ok &= good
    return ok, results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dynlogits.testing.cuda.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--steps", type=int, default=200, help="timed steady steps per measurement")
    parser.add_argument("--watermark-only", action="store_true", help="only the watermark section")
    parser.add_argument("--kernels-only", action="store_true", help="only the other kinds' fused kernels")
    parser.add_argument("--cpu", action="store_true",
                        help="no GPU: the watermark's Triton kernels in Triton's interpreter against eager (bits only)")
    args = parser.parse_args(argv)
    if args.cpu:
        ok = watermark_check.interpreted_check()
        ok &= _kernel_checks(None)[0]
        print("\nresult:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    if not torch.cuda.is_available():
        print(f"error: no CUDA device (torch {torch.__version__})", file=sys.stderr)
        return 2
    cuda = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "sequences": []}
    if args.kernels_only:
        ok, results["kernels"] = _kernel_checks(cuda)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        print("\nresult:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    if args.watermark_only:
        ok, results["watermark"] = watermark_check.run(cuda, vocab=args.vocab, steps=args.steps)
        fused_ok, results["watermark_fused"] = watermark_check.run_fused(cuda, vocab=args.vocab, steps=args.steps)
        ok &= fused_ok
        results["costs"] = _watermark_costs(args.vocab, args.steps)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        print("\nresult:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    planted = _detectors_see_planted_syncs(cuda)
    results["planted"] = planted
    ok = all(v == ("not a sync" not in k) for k, v in planted.items())
    print(f"planted (seen?): {planted} -> {'ok' if ok else 'FAILED'}", flush=True)
    logging.getLogger("dynlogits").setLevel(logging.CRITICAL)  # the failing requests are expected
    for dtype in (torch.float32, torch.bfloat16):
        reference = run_sequence(torch.device("cpu"), dtype=dtype, replay=None)
        got = run_sequence(cuda, dtype=dtype, replay=reference, lag=True)
        diffs = compare(reference, got)
        reported = sum(NO_TOKEN_LEFT in f for f in got.failures)
        want_reported = sum(NO_TOKEN_LEFT in f for f in reference.failures)
        good = not diffs and not got.syncs and reported == want_reported == 2
        ok &= good
        label = str(dtype).removeprefix("torch.")
        print(f"sequence ({label}): {len(got.logits)} steps; syncs {len(got.syncs)}; rows differing from CPU "
              f"{len(diffs)}; failures reported {reported} (CPU {want_reported}) -> {'ok' if good else 'FAILED'}",
              flush=True)
        for line in (got.syncs + diffs)[:10]:
            print(f"    {line}")
        results["sequences"].append({"dtype": str(dtype), "steps": len(got.logits), "syncs": got.syncs, "diffs": diffs,
                                     "failures": got.failures, "reference_failures": reference.failures, "ok": good})
    results["failures"] = failure_checks(cuda)
    for r in results["failures"]:
        ok &= r["ok"]
        print(f"failure, {r['sequence']}: reported {r['reported']}; syncs {len(r['syncs'])} -> "
              f"{'ok' if r['ok'] else 'FAILED'}", flush=True)
    costs: list[Cost] = []
    print(f"\n{'kind':<16}{'batch':>6}  {'impl':<19}{'wall ms':>10}{'device ms':>11}{'ops':>7}{'pageable':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("forced_sequence", "banned_tokens", "logit_bias", "mixed"):
            for batch in (1, 64, 256):
                for c in measure(kind, batch, vocab=args.vocab, steps=args.steps, trace_dir=Path(tmp)):
                    costs.append(c)
                    ok &= not c.impl.startswith("adapter") or c.pageable == 0
                    print(f"{c.kind:<16}{c.batch:>6}  {c.impl:<19}{c.wall_ms:>10.4f}{c.device_ms:>11.4f}"
                          f"{c.ops:>7.1f}{c.pageable:>9}", flush=True)
    results["costs"] = [asdict(c) for c in costs]
    print(flush=True)
    watermark_ok, results["watermark"] = watermark_check.run(cuda, vocab=args.vocab, steps=args.steps)
    fused_ok, results["watermark_fused"] = watermark_check.run_fused(cuda, vocab=args.vocab, steps=args.steps)
    ok &= watermark_ok and fused_ok
    results["costs"] += _watermark_costs(args.vocab, args.steps)
    kernels_ok, results["kernels"] = _kernel_checks(cuda)
    ok &= kernels_ok
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print("\nresult:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
