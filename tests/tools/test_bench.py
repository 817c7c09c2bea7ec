"""``python -m dynlogits.tools.bench``: it runs, every implementation produces a record for every
kind and batch, the records have their documented shape, and the docs are regenerated. Speed is never
asserted here; the benchmark prints its targets itself."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MICRO_KEYS = {"suite", "kind", "batch", "vocab", "impl", "median_ms", "launches", "syncs", "rep_ms"}
ENGINE_KEYS = {"suite", "kind", "impl", "tok_per_s", "rounds", "paired_ratio", "paired_interval", "round_tok_per_s",
               "attributed_ratio", "round_adapter_ms", "attributed_share"}
WIRE_KEYS = {"suite", "kind", "impl", "stage", "median_us"}


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    return subprocess.run([sys.executable, "-m", "dynlogits.tools.bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict], Path]:
    out = tmp_path_factory.mktemp("bench")
    proc = _bench("all", "--quick", "--json", str(out / "records.json"), "--write-docs", "--docs-dir", str(out / "docs"),
                  timeout=600)
    return _ok(proc), json.loads((out / "records.json").read_text()), out / "docs"


@pytest.mark.heavy  # the bench's quick run, in a subprocess
def test_quick_run_records_every_implementation_for_every_kind_and_batch(quick_run) -> None:
    from dynlogits.tools.bench.micro import BASELINES
    from dynlogits.tools.bench.workloads import KINDS

    stdout, records, _ = quick_run
    micro = [r for r in records if r["suite"] == "micro"]
    assert all(set(r) == MICRO_KEYS for r in micro)
    assert all(isinstance(r["median_ms"], float) and math.isfinite(r["median_ms"]) and r["median_ms"] > 0 for r in micro)
    reps = {len(r["rep_ms"]) for r in micro}  # every impl of every case timed in the same repetitions
    assert len(reps) == 1 and reps.pop() > 1
    assert all(min(r["rep_ms"]) > 0 and statistics.median(r["rep_ms"]) == r["median_ms"] for r in micro)
    got = {(r["kind"], r["batch"], r["vocab"], r["impl"]) for r in micro}
    assert len(got) == len(micro), "one record per measurement"
    counted = [r for r in micro if r["impl"] in ("adapter", "adapter_v2")]
    # a kind whose requests fail in the counting sequence gets no counts, and the run says why
    uncounted = {r["kind"] for r in counted if r["launches"] is None and r["syncs"] is None}
    assert all(f"launches/syncs of {kind}: " in stdout for kind in uncounted)
    assert all(isinstance(r["launches"], int) and r["launches"] > 0 and isinstance(r["syncs"], int)
               for r in counted if r["kind"] not in uncounted)
    assert all(r["launches"] is None and r["syncs"] is None for r in micro if r not in counted)
    want = set()
    for kind in KINDS:
        impls = ["adapter", "adapter_v2", "loop"] + (["reference", "floor"] if kind == "forced_sequence" else [])
        impls += ["baseline"] if kind in BASELINES else []  # banned_tokens' adapter, side by side
        impls += ["vllm_watermark"] if kind == "watermark" else []  # vLLM's own watermarker
        want |= {(kind, batch, 151936, impl) for batch in (1, 64) for impl in impls}
    assert got == want


@pytest.mark.heavy  # the bench's quick run, in a subprocess
def test_quick_run_measures_both_wire_paths_and_leaves_the_engine_out(quick_run) -> None:
    stdout, records, _ = quick_run
    wire = [r for r in records if r["suite"] == "wire"]
    assert all(set(r) == WIRE_KEYS and r["median_us"] > 0 for r in wire)
    assert {(r["kind"], r["impl"], r["stage"]) for r in wire} == {
        (kind, impl, stage) for kind in ("forced_sequence_64", "mixed")
        for impl in ("msgspec", "pydantic") for stage in ("encode", "decode")}
    assert not [r for r in records if r["suite"] == "engine"]
    assert "skipped: engine: left out of `all --quick`" in stdout
    assert {r["suite"] for r in records} == {"micro", "wire"}


@pytest.mark.heavy  # the bench's quick run, in a subprocess
def test_quick_run_prints_the_machine_the_ratios_and_a_line_per_target(quick_run) -> None:
    stdout, _, _ = quick_run
    assert "machine: " in stdout and "versions: torch " in stdout and "torch.set_num_threads(1)" in stdout
    for column in ("floor/adapter", "reference/adapter", "loop/adapter", "pydantic/msgspec", "launches", "syncs"):
        assert column in stdout
    targets = [line for line in stdout.splitlines() if line.startswith(("[met]", "[NOT MET]", "[undecided]", "[not measured]"))]
    assert len(targets) == 32  # no forced reference ratio at batch 64 (the floor bounds it); adapter_v2 <= 1.5x adapter: one per workload; the adapter's share of a step: one per engine kind
    # measured in this run: every micro and wire target but batch 256 (not in --quick); the engine ones are not
    assert sum(line.startswith("[not measured] engine") for line in targets) == 6
    assert [line for line in targets if line.startswith("[not measured]") and not line.startswith("[not measured] engine")] \
        == [line for line in targets if line.startswith("[not measured] forced_sequence, batch 256")] != []
    assert any(line.startswith("[met]") and "syncs = 0" in line for line in targets)
    assert any(line.startswith("[met] forced_sequence, adapter and adapter_v2, every batch: launches <= 4")
               for line in targets)


@pytest.mark.heavy  # the bench's quick run, in a subprocess
def test_quick_run_regenerates_the_performance_page_and_its_plot(quick_run) -> None:
    _, _, docs = quick_run
    page = (docs / "performance.md").read_text()
    assert "python -m dynlogits.tools.bench all --write-docs" in page
    assert "| forced_sequence |" in page and "![cost per decode step against batch size](performance.png)" in page
    assert "[NOT MET]" in page or "[met]" in page
    assert (docs / "performance.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_cuda_requested_without_cuda_fails_naming_the_flag() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = _bench("micro", "--device", "cuda", timeout=120)
    assert proc.returncode == 2
    assert "--device cuda: CUDA is not available" in proc.stderr


def test_reference_wrapper_refuses_kinds_the_reference_lacks() -> None:
    from vllm import SamplingParams

    from dynlogits.specs import WIRE_KEY
    from dynlogits.tools.bench.reference import ReferenceForcedSequenceProcessor

    forced = {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 1}
    ReferenceForcedSequenceProcessor.validate_params(SamplingParams(extra_args={WIRE_KEY: [forced]}))
    with pytest.raises(ValueError, match=r"dynamo_logits\[1\]\.kind: the reference supports only 'forced_sequence'"):
        ReferenceForcedSequenceProcessor.validate_params(
            SamplingParams(extra_args={WIRE_KEY: [forced, {"kind": "banned_tokens", "token_ids": [3]}]}))


def test_an_implementation_leaving_other_logits_than_the_adapter_is_refused() -> None:
    import torch

    from dynlogits.tools.bench.micro import _check

    want = torch.tensor([[0.0, -math.inf, 2.0]])
    assert _check("loop", want.clone(), want) is None
    assert "different logits at [row, id] [[0, 2]]" in _check("loop", torch.tensor([[0.0, -math.inf, 3.0]]), want)
    assert _check("reference", torch.tensor([[5.0, -math.inf, 7.0]]), want) is None  # own logits kept, same argmax
    assert _check("reference", torch.tensor([[5.0, 1.0, 7.0]]), want) == "a different set of finite logits"
    assert _check("reference", torch.tensor([[9.0, -math.inf, 7.0]]), want) == "a different argmax"


def test_targets_are_met_not_met_or_not_measured_from_the_ratios() -> None:
    from dynlogits.tools.bench.records import EngineRecord, MicroRecord, WireRecord
    from dynlogits.tools.bench.report import evaluate_targets

    def micro(kind: str, batch: int, impl: str, ms: float) -> MicroRecord:
        return MicroRecord(kind=kind, batch=batch, vocab=151936, impl=impl, median_ms=ms)

    records = [micro("forced_sequence", 64, "adapter", 1.0), micro("forced_sequence", 64, "floor", 0.9),
               micro("forced_sequence", 64, "reference", 2.0), micro("banned_tokens", 64, "adapter", 0.1),
               micro("banned_tokens", 64, "loop", 1.5), micro("banned_phrases", 64, "adapter", 0.25),
               micro("banned_phrases", 64, "loop", 3.0), micro("banned_phrases", 64, "baseline", 0.2),
               EngineRecord(kind="none", impl="none", tok_per_s=80.0),
               EngineRecord(kind="none", impl="adapter", tok_per_s=100.0, rounds=3),
               EngineRecord(kind="banned_tokens", impl="adapter", tok_per_s=98.0, rounds=3, paired_ratio=0.985),
               EngineRecord(kind="forced_sequence", impl="reference", tok_per_s=99.0, rounds=3),  # unpaired: not read
               WireRecord(kind="forced_sequence_64", impl="msgspec", stage="decode", median_us=12.0)]
    state = {(t.name, t.goal.split(" (")[0]): t.met for t in evaluate_targets(records)}
    assert state[("forced_sequence, batch 64, vocab 151936", "adapter <= 1.25x the floor")] is True
    assert not any("faster than the reference" in goal for _, goal in state)  # bounded by the floor: no target
    assert state[("banned_tokens, batch 64, vocab 151936", ">= 10x faster than the per-row loop")] is True
    assert state[("logit_bias, batch 64, vocab 151936", ">= 10x faster than the per-row loop")] is None
    assert state[("banned_phrases, batch 64, vocab 151936", ">= 10x faster than the per-row loop")] is True  # 12x
    assert state[("banned_phrases, batch 64, vocab 151936", "adapter <= 2x banned_tokens' adapter, side by side")] is True  # 1.25x its baseline (2.5x the banned_tokens run's)
    assert state[("engine, banned_phrases on every request", ">= 0.99x the throughput with no payload, paired in one "
                                                            "engine")] is None
    paired = ">= 0.99x the throughput with no payload, paired in one engine"
    assert state[("engine, banned_tokens on every request", paired)] is False  # 0.985 paired, though 1.22x unpaired
    floor_goal = ">= 0.99x the throughput the floor's memset leaves"
    assert state[("engine, forced_sequence on every request", floor_goal)] is None
    # 64 rows at 100 tok/s: a 640 ms step; a 64-row floor of 6.4 ms leaves 640 / 646.4 = 0.990x
    timed = [EngineRecord(kind="none", impl="adapter", tok_per_s=100.0, rounds=7),
             micro("forced_sequence", 64, "floor", 6.4)]
    met = evaluate_targets([*timed, EngineRecord(kind="forced_sequence", impl="adapter", tok_per_s=90.0, rounds=7,
                                                 paired_ratio=0.985)])
    assert [t.line() for t in met if t.name.startswith("engine, forced")] == [
        "[met] engine, forced_sequence on every request: >= 0.99x the throughput the floor's memset leaves (paired "
        "ratio over floor_bound: exact forcing masks the row; met or not only when its 95% interval is wholly on one "
        "side); measured 0.985x over 7 round(s), floor_bound 0.990x"]
    missed = evaluate_targets([*timed, EngineRecord(kind="forced_sequence", impl="adapter", tok_per_s=90.0, rounds=7,
                                                    paired_ratio=0.975)])
    assert [t.met for t in missed if t.name.startswith("engine, forced")] == [False]
    assert state[("wire, 64-token forced_sequence", "decode < 20 µs")] is True


def test_forced_sequences_share_target_reads_the_share_beyond_the_floor_measured_in_the_same_engine() -> None:
    """Exact forcing masks the row, so the floor's -inf fill is in any exact forcing's share of a step:
    the forced share target reads the adapter's share beyond the floor's share measured in the same
    engine (impl ``floor``); the micro floor's estimate is printed beside it and never judged (the
    other kinds read their share whole)."""
    from dynlogits.tools.bench.records import EngineRecord, MicroRecord
    from dynlogits.tools.bench.report import evaluate_targets

    # the micro estimate: 64 rows at 100 tok/s, a 640 ms step; a 64-row floor of 19.8 ms leaves 640 / 659.8: 3.00%
    micro: list[EngineRecord | MicroRecord] = [
        EngineRecord(kind="none", impl="adapter", tok_per_s=100.0, rounds=7),
        MicroRecord(kind="forced_sequence", batch=64, vocab=151936, impl="floor", median_ms=19.8)]
    engine_floor = EngineRecord(kind="forced_sequence", impl="floor", tok_per_s=95.0, rounds=7, paired_ratio=0.995,
                                round_adapter_ms=(30.0,), attributed_share=0.0400)

    def share_target(kind: str, share: float, floor: list[EngineRecord | MicroRecord]) -> tuple[bool | None, str]:
        got = evaluate_targets([*floor, EngineRecord(kind=kind, impl="adapter", tok_per_s=90.0, rounds=7,
                                                     paired_ratio=0.99, attributed_share=share)])
        (t,) = [t for t in got if t.name == f"engine, the adapter's own share of a step with {kind} on every request"]
        return t.met, t.line()

    # 4.90% is 0.90 points beyond the engine's floor (4.00%), though 1.90 beyond the micro estimate (3.00%)
    met, line = share_target("forced_sequence", 0.0490, [*micro, engine_floor])
    assert met is True
    assert ("measured 4.90%, the floor's 4.00% (engine, same run); micro estimate of the floor's share, "
            "1 - floor_bound: 3.00% (context only)") in line and "beyond the floor's share, measured in the same engine" in line
    assert share_target("forced_sequence", 0.0510, [*micro, engine_floor])[0] is False  # 1.10 points beyond it
    # 3.90% is within 1 point of the micro estimate, but the engine's floor is not measured: no verdict
    met, line = share_target("forced_sequence", 0.0390, micro)
    assert met is None and "the floor's share not measured in this engine" in line
    assert share_target("forced_sequence", 0.0490, [engine_floor])[0] is True  # no micro run: still decided
    assert share_target("banned_tokens", 0.0390, [*micro, engine_floor])[0] is False  # the other kinds: their whole share
    no_floor = evaluate_targets([EngineRecord(kind="forced_sequence", impl="adapter", tok_per_s=90.0, rounds=7,
                                              attributed_share=0.039)])
    assert [t.met for t in no_floor if "own share" in t.name and "forced" in t.name] == [None]  # no floor: undecided


def test_the_micro_adapter_holds_every_row_of_a_batch_larger_than_the_cpu_default_resident() -> None:
    """vLLM's CPU default schedules 128 requests a step; a 256-row step measured with that config
    would time 128 rows on the per-row fallback, a configuration no engine runs."""
    import torch

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.tools.bench import workloads
    from dynlogits.tools.bench.micro import _Case, _V1Processor
    from dynlogits.tools.bench.models import bench_model_dir, eos_token_id

    vocab, batch = 151936, 200
    eos = eos_token_id(bench_model_dir(vocab))
    case = _Case("banned_tokens", vocab, eos,
                 payloads=[workloads.payload("banned_tokens", vocab_size=vocab, eos_token_id=eos, seed=i)
                           for i in range(batch)], prompt=[1] * 4, outputs=[[] for _ in range(batch)])
    impl = _V1Processor("adapter", DynamoVllmLogitsProcessor, case, torch.device("cpu"))
    assert impl.processor._resident.held() == batch


def test_the_floor_bounds_how_much_faster_than_the_reference_forcing_can_be() -> None:
    from dynlogits.tools.bench.records import EngineRecord, MicroRecord
    from dynlogits.tools.bench.report import forcing_bound_lines

    def forced(impl: str, ms: float) -> MicroRecord:
        return MicroRecord(kind="forced_sequence", batch=64, vocab=151936, impl=impl, median_ms=ms)

    assert forcing_bound_lines([forced("adapter", 1.2)]) == []  # no floor measured: nothing to say
    lines = forcing_bound_lines([forced("adapter", 1.2), forced("floor", 1.0), forced("reference", 2.4)])
    assert lines[0].endswith("the adapter takes 1.200 ms per step, 1.20x the floor's memset (1.000 ms)")
    assert "costs 2.40x the floor" in lines[1] and "that masks can be more than 2.40x faster" in lines[1]
    assert lines[1].endswith("the floor target (<= 1.25x) means at least 1.92x faster")  # 2.40 / 1.25
    engine = [EngineRecord(kind="none", impl="none", tok_per_s=3200.0)]  # 64 rows a step: 20 ms
    assert forcing_bound_lines([forced("floor", 1.0), *engine], engine_requests=64) == [
        "bound: engine: a step of 64 rows takes ~20.0 ms without a processor, median; the floor's memset alone makes it "
        "~21.0 ms, about 0.952x the throughput (an estimate from the micro floor, to set beside the paired "
        "forced_sequence ratio)"]
    assert forcing_bound_lines([forced("floor", 1.0), *engine], engine_requests=8) == []  # not the floor's rows
    engine.append(EngineRecord(kind="none", impl="adapter", tok_per_s=1600.0))  # the paired base wins: 40 ms
    assert forcing_bound_lines([forced("floor", 1.0), *engine], engine_requests=64)[0].startswith(
        "bound: engine: a step of 64 rows takes ~40.0 ms with no payload (adapter idle), median; the floor's memset "
        "alone makes it ~41.0 ms, about 0.976x the throughput")


def test_engine_rounds_change_order_and_pair_each_kind_with_the_same_rounds_idle_batch() -> None:
    from dynlogits.tools.bench.engine import records_for
    from dynlogits.tools.bench.engine_worker import round_order

    kinds = ("none", "banned_tokens", "forced_sequence")
    orders = [round_order(kinds, r) for r in range(6)]
    assert all(sorted(o) == sorted(kinds) for o in orders)
    assert {o[0] for o in orders} == set(kinds)  # no kind always first
    follows = {(o[i], o[i + 1]) for o in orders for i in range(2)}
    assert len(follows) == 6  # every kind right after every other one
    assert round_order(("none",), 5) == ["none"]

    # a slow second round (another job on the machine) moves both kinds alike: the paired ratio keeps it out
    recs = {r.kind: r for r in records_for("adapter", {"none": [100.0, 60.0, 102.0],
                                                       "banned_tokens": [99.0, 59.0, 90.0],
                                                       "forced_sequence": [98.0, 100.0, 97.0]})}
    assert recs["none"].tok_per_s == 100.0 and recs["none"].paired_ratio is None and recs["none"].rounds == 3
    assert recs["banned_tokens"].tok_per_s == 90.0 and recs["banned_tokens"].round_tok_per_s == (99.0, 59.0, 90.0)
    assert recs["banned_tokens"].paired_ratio == pytest.approx(59.0 / 60.0)  # median of 0.99, 0.983, 0.882
    assert recs["forced_sequence"].paired_ratio == pytest.approx(0.98)
    # three rounds are too few for a 95% interval: the lowest and highest ratio, holding the median 75% of the time
    interval = recs["banned_tokens"].paired_interval
    assert (interval.low, interval.high, interval.confidence) == pytest.approx((90.0 / 102.0, 0.99, 0.75))
    assert recs["none"].paired_interval is None
    alone = records_for("reference", {"forced_sequence": [50.0, 70.0]})
    assert [(r.tok_per_s, r.paired_ratio, r.rounds, r.paired_interval) for r in alone] == [(60.0, None, 2, None)]


def test_the_median_interval_takes_order_statistics_with_the_binomial_confidence() -> None:
    from dynlogits.tools.bench.stats import median_interval

    # 25 rounds: the 8th smallest to the 8th largest, 1 - 2 P(Bin(25, 1/2) <= 7) = 95.7%; order does not matter
    values = [float(v) for v in range(25, 0, -1)]
    got = median_interval(values)
    assert (got.low, got.high) == (8.0, 18.0) and got.confidence == pytest.approx(0.95672, abs=1e-5)
    assert median_interval(values, confidence=0.5).low == 11.0  # 11th to 15th: 58%; 12th to 14th: 31%
    assert median_interval([3.0, 1.0, 2.0]) == median_interval([1.0, 2.0, 3.0])
    assert (median_interval([1.0, 2.0, 3.0]).low, median_interval([1.0, 2.0, 3.0]).confidence) == (1.0, 0.75)
    assert median_interval([0.5]).confidence == 0.0
    for bad, why in (([], "at least one value"), ([1.0, 2.0], "confidence must lie")):
        with pytest.raises(ValueError, match=why):
            median_interval(bad, confidence=0.95 if bad == [] else 1.0)


def test_a_micro_target_is_decided_on_the_interval_of_its_repetitions_ratios() -> None:
    from dynlogits.tools.bench.records import MicroRecord
    from dynlogits.tools.bench.report import evaluate_targets

    def line(num: list[float], den: list[float], kind: str = "banned_phrases", impls: tuple[str, str] = ("loop", "adapter"),
             goal: str = "(loop/adapter)") -> str:
        records = [MicroRecord(kind=kind, batch=64, vocab=151936, impl=impl, median_ms=statistics.median(t), rep_ms=tuple(t))
                   for impl, t in zip(impls, (num, den))]
        target, = [t for t in evaluate_targets(records) if t.name == f"{kind}, batch 64, vocab 151936" and goal in t.goal]
        assert (target.met is None) == target.undecided
        return target.line()

    def over_floor(adapter: list[float]) -> str:  # an at-most target: forced_sequence's adapter over the floor
        return line(adapter, [1.0] * 30, "forced_sequence", ("adapter", "floor"), "(adapter/floor)")

    ones = [1.0] * 30
    assert line([10.5 + i / 100 for i in range(30)], ones).startswith("[met] ")
    assert line([9.0 + i / 100 for i in range(30)], ones).startswith("[NOT MET] ")
    straddling = line([9.0 + i / 15 for i in range(30)], ones)  # ratios 9.00 .. 10.93, median 9.97
    assert straddling.startswith("[undecided] banned_phrases, batch 64, vocab 151936: >= 10x faster than the per-row loop")
    assert straddling.endswith("measured 9.97x (median of 30 repetitions' ratios, 96% interval 9.60-10.33); the "
                               "interval holds 10x: these repetitions cannot decide it")
    # paired by repetition: a slow phase that slows both sides alike leaves every ratio at 11x
    phases = [1.0 + (i % 3) for i in range(30)]
    assert line([11.0 * p for p in phases], phases).startswith("[met] ")
    assert over_floor([1.2] * 30).startswith("[met] ")  # at most 1.25x
    assert over_floor([1.15 + i / 100 for i in range(30)]).startswith("[undecided] ")  # 1.15 .. 1.44
    assert over_floor([1.3] * 30).startswith("[NOT MET] ")


def test_a_paired_engine_target_is_decided_only_when_its_interval_is_on_one_side() -> None:
    from dynlogits.tools.bench.records import EngineRecord
    from dynlogits.tools.bench.report import evaluate_targets
    from dynlogits.tools.bench.stats import MedianInterval

    def line(low: float, high: float) -> str:
        rec = EngineRecord(kind="banned_phrases", impl="adapter", tok_per_s=99.0, rounds=25, paired_ratio=(low + high) / 2,
                           paired_interval=MedianInterval(low, high, 0.957))
        target, = [t for t in evaluate_targets([rec]) if t.name == "engine, banned_phrases on every request"]
        assert (target.met is None) == target.undecided
        return target.line()

    assert line(0.991, 1.02).startswith("[met] ")
    assert line(0.99, 1.02).startswith("[met] ")  # the bound itself is met
    assert line(0.95, 0.989).startswith("[NOT MET] ")
    undecided = line(0.96, 1.0)
    assert undecided.startswith("[undecided] engine, banned_phrases on every request: >= 0.99x the throughput")
    assert undecided.endswith("measured 0.980x over 25 round(s), 96% interval 0.960-1.000; the interval holds "
                              "0.990: these rounds cannot decide it")


def test_engine_table_shows_medians_rounds_paired_and_unpaired_ratios() -> None:
    from dynlogits.tools.bench.engine import records_for
    from dynlogits.tools.bench.report import engine_table

    records = [*records_for("none", {"none": [200.0, 180.0, 190.0]}),
               *records_for("adapter", {"none": [100.0, 60.0, 102.0], "forced_sequence": [98.0, 100.0, 97.0]})]
    text = "\n".join(engine_table(records))
    assert "| tok/s (median) |" in text and "| rounds |" in text and "| paired x no payload |" in text
    assert "| x none (unpaired) |" in text and "±20%" in text
    row = next(line for line in text.splitlines() if "forced_sequence" in line)
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "adapter", "forced_sequence", "3", "98", "97–100", "0.980 (0.951–1.667)", "—", "—", "—", "0.52"]
    assert "unpaired: the adapter installed but idle (no payload) ran at 0.53x the engine without a processor" in text
    assert engine_table([]) == []
    # the floor ran in the adapter's engine: its rounds pair with that engine's no-payload batches
    floor = records_for("floor", {"none": [100.0, 60.0, 102.0], "forced_sequence": [99.0, 66.0, 100.0]})[1]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in engine_table([*records, floor])]
    assert next(c for c in cells if c[0] == "floor")[:6] == ["floor", "forced_sequence", "3", "99", "66–100",
                                                            "0.990 (0.980–1.100)"]


def test_the_attributed_ratio_charges_each_batch_only_the_adapter_time_beyond_the_idle_batch() -> None:
    from dynlogits.tools.bench.engine import records_for
    from dynlogits.tools.bench.report import engine_table

    # 1000 tokens a batch at 100 tok/s: 10 s = 10000 ms of idle batch; the kind's batch spent 100 ms
    # more in the adapter in round 1 and 200 ms more in round 2 (and the idle batch 10 ms, 20 ms)
    recs = {r.kind: r for r in records_for("adapter", {"none": [100.0, 100.0], "banned_tokens": [97.0, 99.0]},
                                           {"none": [10.0, 20.0], "banned_tokens": [110.0, 220.0]}, tokens=1000)}
    assert recs["banned_tokens"].attributed_ratio == pytest.approx((10000 / 10100 + 10000 / 10200) / 2)
    assert recs["banned_tokens"].round_adapter_ms == (110.0, 220.0)
    # its share of the kind's own batch: 1000 tokens at 97 and 99 tok/s
    assert recs["banned_tokens"].attributed_share == pytest.approx((110 / (1e6 / 97) + 220 / (1e6 / 99)) / 2)
    assert recs["none"].attributed_share == pytest.approx((10 / 1e4 + 20 / 1e4) / 2)
    assert recs["none"].attributed_ratio is None and recs["none"].round_adapter_ms == (10.0, 20.0)
    assert records_for("adapter", {"none": [1.0], "banned_tokens": [1.0]})[1].attributed_ratio is None  # not timed
    row = next(line for line in engine_table(list(recs.values())) if "banned_tokens" in line)
    assert [c.strip() for c in row.strip("|").split("|")][6:8] == ["165.0", "0.9852"]


def test_the_timed_adapter_counts_into_a_file_another_process_reads(tmp_path: Path) -> None:
    from dynlogits.tools.bench.timed import CallTimes

    reader = CallTimes(tmp_path / "times", create=True)
    assert reader.read() == (0, 0) and reader.split() == (0, 0, 0, 0)
    reader.label = 3  # the driver names the batch; the engine's process reads it
    code = ("import sys; from dynlogits.tools.bench.timed import CallTimes; "
            "t = CallTimes(sys.argv[1]); t.add(1500); t.add(700, apply=True); t.add(500); print(t.label)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "times")], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert out.split()[-1] == "3"
    assert reader.read() == (2700, 3)
    assert reader.split() == (2000, 2, 700, 1)  # update_state's ns and calls, then apply's


def test_section_timers_time_named_functions_per_batch_label(tmp_path: Path) -> None:
    """``SECTIONS_ENV``'s timers (the engine's profile without cProfile): a module's global and a
    class's plain and static methods keep working, timed under the label the driver wrote, and
    each label's sums are written when the label changes."""
    import types

    from dynlogits.tools.bench.timed import CallTimes, _Sections

    module = types.ModuleType("dynlogits_bench_sections_probe")

    class Group:
        def step(self, x: int) -> int:
            return x + 1

        @staticmethod
        def settles(x: int) -> bool:
            return x > 0

    module.Group = Group  # type: ignore[attr-defined]
    module.helper = lambda x: 2 * x  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        times = CallTimes(tmp_path / "times", create=True)
        sections = _Sections(str(tmp_path / "out"), times, f"{module.__name__}:helper, {module.__name__}:Group.step,"
                             f"{module.__name__}:Group.settles")
        times.label = 1
        sections.check_label()
        assert module.helper(3) == 6 and Group().step(1) == 2 and Group.settles(1) and Group().settles(1)
        times.label = 2
        sections.check_label()  # label 1's sums written
        assert Group().step(5) == 6
        written = json.loads((tmp_path / "out" / "sections.json").read_text())
    finally:
        del sys.modules[module.__name__]
    calls = {name.split(":")[1]: count for name, (_, count) in written["spent"]["1"].items()}
    assert calls == {"helper": 1, "Group.step": 1, "Group.settles": 2} and written["threads"] >= 1
    assert "2" not in written["spent"]  # label 2 not over yet


def test_the_floors_processor_fills_exactly_the_marked_rows_through_batch_changes(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``TimedFloorProcessor`` follows vLLM's ``BatchUpdate`` (removed, added, moved: one-way moves
    and swaps) and writes -inf over the marked requests' rows only: one ``fill_`` of the logits
    when they are the whole batch (the micro floor's work), else one ``index_fill_``; its calls
    are counted in the floor's own file."""
    import torch
    from torch.overrides import TorchFunctionMode
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from dynlogits.tools.bench.timed import FLOOR_MARKER, FLOOR_TIMES_ENV, CallTimes, TimedFloorProcessor

    class Ops(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    times = CallTimes(tmp_path / "floor", create=True)
    monkeypatch.setenv(FLOOR_TIMES_ENV, str(tmp_path / "floor"))
    floor = TimedFloorProcessor(None, torch.device("cpu"), False)
    marked, plain = SamplingParams(extra_args={FLOOR_MARKER: True}), SamplingParams(extra_args={"other": 1})

    def step(update: BatchUpdate | None, batch: int) -> tuple[list[int], list[str]]:
        floor.update_state(update)
        logits = torch.zeros(batch, 8)
        with Ops() as ops:
            floor.apply(logits)
        return [i for i in range(batch) if torch.isneginf(logits[i]).all()], [n for n in ops.names if "fill" in n]

    added: list[tuple[int, SamplingParams, list[int] | None, list[int]]] = [
        (0, marked, None, []), (1, plain, None, []), (2, marked, None, []), (3, marked, None, [])]
    assert step(BatchUpdate(batch_size=4, removed=[], added=added, moved=[]), 4) == ([0, 2, 3], ["index_fill_"])
    assert step(None, 4) == ([0, 2, 3], ["index_fill_"])  # no change: the same rows
    # 1 leaves, 3 moves into its place: the marked rows are the whole batch
    condensed = BatchUpdate(batch_size=3, removed=[1], added=[], moved=[(3, 1, MoveDirectionality.UNIDIRECTIONAL)])
    assert step(condensed, 3) == ([0, 1, 2], ["fill_"])
    # an unmarked request joins at 3 and swaps with 0
    swapped = BatchUpdate(batch_size=4, removed=[], added=[(3, plain, None, [])], moved=[(3, 0, MoveDirectionality.SWAP)])
    assert step(swapped, 4) == ([1, 2, 3], ["index_fill_"])
    # a marked request replaces an unmarked one at the same index, and one leaves for good
    assert step(BatchUpdate(batch_size=4, removed=[3], added=[(0, marked, None, [])], moved=[]), 4) == ([0, 1, 2], ["index_fill_"])
    assert step(BatchUpdate(batch_size=0, removed=[0, 1, 2], added=[], moved=[]), 2) == ([], [])
    assert times.split()[1::2] == (6, 6)  # every update_state and apply counted


def test_the_floors_batch_becomes_its_own_record_paired_with_the_engines_idle_batches() -> None:
    """In the adapter's engine the floor's batch (``engine_worker.FLOOR_KIND``) is the record impl
    ``floor``, kind ``forced_sequence``: paired with that engine's no-payload batches round by round,
    its time the floor processor's own (``floor_ms``), never the adapter's."""
    from dynlogits.tools.bench.engine import split_floor
    from dynlogits.tools.bench.engine_worker import FLOOR_KIND

    got = {"tok_per_s": {"none": [100.0, 50.0, 100.0], "forced_sequence": [95.0, 48.0, 97.0], FLOOR_KIND: [98.0, 51.0, 96.0]},
           "adapter_ms": {"none": [1.0, 1.0, 1.0], "forced_sequence": [50.0, 60.0, 55.0], FLOOR_KIND: [1.0, 2.0, 1.0]},
           "floor_ms": {"none": [0.1, 0.1, 0.1], "forced_sequence": [0.1, 0.1, 0.1], FLOOR_KIND: [30.0, 40.0, 35.0]}}
    recs = {(r.impl, r.kind): r for r in split_floor("adapter", got, tokens=1000)}
    assert set(recs) == {("adapter", "none"), ("adapter", "forced_sequence"), ("floor", "forced_sequence")}
    floor = recs[("floor", "forced_sequence")]
    assert floor.paired_ratio == pytest.approx(0.98) and floor.round_tok_per_s == (98.0, 51.0, 96.0)  # 0.98, 1.02, 0.96
    assert floor.round_adapter_ms == (30.0, 40.0, 35.0)
    assert floor.attributed_share == pytest.approx(statistics.median([30 / (1e6 / 98), 40 / (1e6 / 51), 35 / (1e6 / 96)]))
    assert floor.attributed_ratio == pytest.approx(statistics.median([1e4 / (1e4 + 29.9), 2e4 / (2e4 + 39.9),
                                                                      1e4 / (1e4 + 34.9)]))
    assert recs[("adapter", "forced_sequence")].round_adapter_ms == (50.0, 60.0, 55.0)
    # an engine without the floor or the adapter's timing: its kinds alone
    alone = split_floor("reference", {"tok_per_s": {"forced_sequence": [50.0, 70.0]}}, tokens=1000)
    assert [(r.impl, r.kind, r.tok_per_s, r.attributed_share) for r in alone] == [("reference", "forced_sequence", 60.0, None)]


def test_the_floors_batch_is_checked_to_have_argmaxed_a_row_of_minus_inf() -> None:
    from types import SimpleNamespace

    from dynlogits.tools.bench.engine_worker import FLOOR_KIND, _check

    def outputs(*rows: list[int]) -> list[SimpleNamespace]:
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=row)]) for row in rows]

    _check(FLOOR_KIND, [None, None], outputs([0, 0, 0], [0, 0, 0]), 3, 1024)  # torch.argmax of equal maxima: id 0
    with pytest.raises(SystemExit, match="floor: request 1 generated"):
        _check(FLOOR_KIND, [None, None], outputs([0, 0, 0], [0, 7, 0]), 3, 1024)  # a row the floor missed


@pytest.mark.engine
def test_engine_suite_runs_every_configuration_on_a_real_engine(tmp_path: Path) -> None:
    """Three real vLLM CPU engines (none, adapter, reference), one after the other, tiny runs:
    a warm-up round and two rounds each, kinds paired inside the adapter's engine."""
    proc = _bench("engine", "--quick", "--json", str(tmp_path / "engine.json"), timeout=900)
    stdout = _ok(proc)
    records = json.loads((tmp_path / "engine.json").read_text())
    assert all(set(r) == ENGINE_KEYS and r["suite"] == "engine" and r["tok_per_s"] > 0 for r in records)
    assert {(r["impl"], r["kind"]) for r in records} == {
        ("none", "none"), ("adapter", "none"), ("adapter", "banned_tokens"), ("adapter", "banned_phrases"),
        ("adapter", "forced_sequence"), ("reference", "forced_sequence"), ("floor", "forced_sequence")}
    assert all(r["rounds"] == 2 and len(r["round_tok_per_s"]) == 2 and all(v > 0 for v in r["round_tok_per_s"])
               and r["tok_per_s"] == pytest.approx(sum(r["round_tok_per_s"]) / 2) for r in records)
    paired = {(r["impl"], r["kind"]) for r in records if r["paired_ratio"] is not None}
    assert paired == {("adapter", "banned_tokens"), ("adapter", "banned_phrases"), ("adapter", "forced_sequence"),
                      ("floor", "forced_sequence")}
    assert all(r["paired_ratio"] > 0 for r in records if r["paired_ratio"] is not None)
    # the adapter's engine counts the time its calls took in the engine's process, batch by batch
    timed = {r["kind"]: r for r in records if r["impl"] == "adapter"}
    assert all(len(r["round_adapter_ms"]) == 2 and all(ms > 0 for ms in r["round_adapter_ms"]) for r in timed.values())
    assert all(0 < timed[k]["attributed_ratio"] <= 1.5 for k in ("banned_tokens", "banned_phrases", "forced_sequence"))
    assert all(0 < r["attributed_share"] < 1 for r in timed.values())
    # the floor's processor, in the same engine, counts its own time on its own batch
    (floor,) = [r for r in records if r["impl"] == "floor"]
    assert len(floor["round_adapter_ms"]) == 2 and all(ms > 0 for ms in floor["round_adapter_ms"])
    assert 0 < floor["attributed_share"] < 1
    assert all(not r["round_adapter_ms"] and r["attributed_ratio"] is None and r["attributed_share"] is None
               for r in records if r["impl"] not in ("adapter", "floor"))
    assert "paired x no payload" in stdout and "x none (unpaired)" in stdout and "adapter ms / batch" in stdout
    lines = stdout.splitlines()
    assert sum(line.startswith(("[met] engine, banned", "[NOT MET] engine, banned", "[undecided] engine, banned"))
               for line in lines) == 2
    assert sum(line.startswith(("[met] engine, the adapter's own share", "[NOT MET] engine, the adapter's own share"))
               for line in lines) == 3  # attributed in the same run, forced_sequence's beyond the same engine's floor
    # the forced paired target reads the micro floor (floor_bound), which an engine-only run lacks
    assert sum(line.startswith("[not measured] engine, forced_sequence") for line in lines) == 1
    assert any(line.startswith("bound: engine, measured: the floor's processor") for line in lines)
    assert "[engine] adapter: round 2/2: " in proc.stderr  # progress, round by round


def test_device_side_targets_read_the_launch_and_sync_counts() -> None:
    from dynlogits.tools.bench.records import MicroRecord
    from dynlogits.tools.bench.report import evaluate_targets

    def rec(kind: str, impl: str, launches: int, syncs: int) -> MicroRecord:
        return MicroRecord(kind=kind, batch=64, vocab=151936, impl=impl, median_ms=1.0, launches=launches, syncs=syncs)

    records = [rec("banned_tokens", "adapter", 1, 0), rec("banned_tokens", "adapter_v2", 10, 0),
               rec("mixed", "adapter", 12, 0), rec("mixed", "adapter_v2", 7, 1),
               rec("scoped", "adapter_v2", 8, 2)]  # resident on both runners: counted like the others
    state = {t.name: (t.goal, t.met, t.measured) for t in evaluate_targets(records)}
    goal, met, measured = state["adapter and adapter_v2, every resident kind and batch, vocab 151936"]
    assert "syncs = 0" in goal and met is False and measured == "3 in all"
    assert state["adapter and adapter_v2, each single-kind workload, every batch"][1:] == (False, "at most 10")
    assert state["adapter and adapter_v2, mixed, every batch"][1:] == (True, "at most 12")
    assert state["forced_sequence, adapter and adapter_v2, every batch"][1:] == (None, "—")  # not measured
    forced = [rec("forced_sequence", "adapter", 4, 0), rec("forced_sequence", "adapter_v2", 3, 0)]
    state = {t.name: (t.met, t.measured) for t in evaluate_targets(forced)}
    assert state["forced_sequence, adapter and adapter_v2, every batch"] == (True, "at most 4")
    state = {t.name: (t.met, t.measured) for t in evaluate_targets([*forced, rec("forced_sequence", "adapter_v2", 5, 0)])}
    assert state["forced_sequence, adapter and adapter_v2, every batch"] == (False, "at most 5")


def test_each_implementation_follows_every_other_alike_across_repetitions() -> None:
    """``run_order``: the first repetition in list order (the adapter first, the check's reference),
    then drawn orders, the same for a seed, in which no implementation follows one other in most
    repetitions (a rotated order has the baseline follow the loop three times in four)."""
    import random
    from collections import Counter

    from dynlogits.tools.bench.micro import run_order

    impls = ["adapter", "adapter_v2", "loop", "baseline"]
    rng = random.Random(7)
    orders = [run_order(impls, rep, rng) for rep in range(400)]
    assert orders[0] == impls and all(sorted(o) == sorted(impls) for o in orders)
    again = random.Random(7)
    assert [run_order(impls, rep, again) for rep in range(400)] == orders
    before = Counter((o[i - 1], o[i]) for o in orders[1:] for i in range(1, len(o)))
    for impl in impls:  # each pair about 100 times of 300 (400 repetitions, 3 places after another)
        followed = {b: before[(b, impl)] for b in impls if b != impl}
        assert min(followed.values()) >= 60 and max(followed.values()) <= 140, (impl, followed)


def test_history_workloads_do_their_work_at_every_measured_step() -> None:
    """watermark: no 4-token context repeats (a repeated one would be left to the engine's sampler);
    no_repeat_ngram: the primed history bans a token at every step, and dry penalizes one."""
    import torch

    from dynlogits import sdk
    from dynlogits.processors.sampling import SamplingView
    from dynlogits.tools.bench import workloads

    vocab, steps = 1024, 40
    for seed in range(3):
        marked = [workloads.next_token(workloads.payload("watermark", vocab_size=vocab, eos_token_id=1), n,
                                       vocab_size=vocab, seed=seed) for n in range(steps)]
        contexts = [tuple(marked[max(0, n - workloads.WATERMARK_WIDTH):n]) for n in range(workloads.WATERMARK_WIDTH, steps)]
        assert len(set(contexts)) == len(contexts) and vocab - 1 not in marked
        for kind in ("no_repeat_ngram", "dry"):
            payload = workloads.payload(kind, vocab_size=vocab, eos_token_id=1, seed=seed)
            request = sdk.realize(payload, vocab_size=vocab, stop_token_id=1,
                                  facts=sdk.RequestFacts.of(prompt_ids=[vocab - 1] * 8, eos_token_id=1,
                                                            sampling=SamplingView(temperature=1.0)))
            assert request is not None
            history = [workloads.next_token(payload, n, vocab_size=vocab, seed=seed) for n in range(workloads.PRIMED[kind])]
            for _ in range(5):
                row = torch.zeros(vocab)
                sdk.apply_row(request, history, row)
                assert int((row != 0).sum()) == 1, kind  # one token banned (-inf) or penalized
                history.append(workloads.next_token(payload, len(history), vocab_size=vocab, seed=seed))


def test_vllms_watermarker_is_checked_against_the_token_the_adapter_forces() -> None:
    import torch

    from dynlogits.tools.bench.micro import _check

    forced = torch.tensor([[-math.inf, 0.0, -math.inf], [0.0, -math.inf, -math.inf]])
    assert _check("vllm_watermark", torch.zeros(2, 3), forced, torch.tensor([1, 0])) is None
    assert _check("vllm_watermark", torch.zeros(2, 3), forced, torch.tensor([1, 2])) == "a different token in rows [1]"
    assert "not one" in _check("vllm_watermark", torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1, 0]))
    assert _check("vllm_watermark", torch.zeros(2, 3), forced, None) == "no tokens drawn"


def test_the_history_workloads_run_checked_side_by_side_with_their_comparisons() -> None:
    """A small micro run: vLLM's own watermarker draws the token the adapter forces in every row
    (else ``BenchmarkError``), and no_repeat_ngram and dry run beside banned_tokens' adapter."""
    from dynlogits.tools.bench.micro import MicroOptions, run_micro

    records, _ = run_micro(MicroOptions(kinds=("watermark", "no_repeat_ngram", "dry"), batches=(3,), vocabs=(1024,),
                                        repeats=2, warmup=1), progress=lambda _: None)
    impls = {(r.kind, r.impl) for r in records}
    assert ("watermark", "vllm_watermark") in impls and ("watermark", "baseline") not in impls
    assert {("no_repeat_ngram", "baseline"), ("dry", "baseline")} <= impls
    counted = {(r.kind, r.impl): r.launches for r in records if r.impl in ("adapter", "adapter_v2")}
    assert counted[("watermark", "adapter")] and counted[("no_repeat_ngram", "adapter")]  # real work counted


def test_hosted_kinds_are_those_the_adapter_runs_per_row() -> None:
    """``workloads.HOSTED_KINDS`` is what the adapter does with each workload today, on both runners."""
    import torch

    from dynlogits.adapters.vllm import DynamoVllmLogitsProcessor
    from dynlogits.tools.bench import workloads
    from dynlogits.tools.bench.micro import _Case, _V1Processor, _V2Adapter

    vocab = 1024
    hosted: dict[str, set[str]] = {"adapter": set(), "adapter_v2": set()}
    for kind in workloads.KINDS:
        payloads = [workloads.payload(kind, vocab_size=vocab, eos_token_id=1, seed=i) for i in range(2)]
        case = _Case(kind, vocab, 1, payloads, [vocab - 1] * 4, [[] for _ in payloads])
        v1 = _V1Processor("adapter", DynamoVllmLogitsProcessor, case, torch.device("cpu"))
        if any(entry.hosted is not None for entry in v1.processor._entries.values()):
            hosted["adapter"].add(kind)
        if _V2Adapter(case, 64).harness.processor._is_hosted.any():
            hosted["adapter_v2"].add(kind)
    assert hosted == {impl: set(kinds) for impl, kinds in workloads.HOSTED_KINDS.items()}


def test_max_model_len_sets_the_width_of_model_runner_v2s_token_matrix_and_must_hold_the_history() -> None:
    """``--max-model-len`` is the V2 harness's token matrix width (default: the last step's history, so
    no empty columns are read); one too short for the history is refused naming the option."""
    import torch

    from dynlogits.tools.bench import workloads
    from dynlogits.tools.bench.micro import MicroOptions, _Case, _impls, _V2Adapter, history_len

    vocab = 1024
    payloads = [workloads.payload("dry", vocab_size=vocab, eos_token_id=1, seed=i) for i in range(2)]
    case = _Case("dry", vocab, 1, payloads, [vocab - 1] * 4, [[] for _ in payloads])
    for opts, width in ((MicroOptions(kinds=("dry",)), history_len("dry", MicroOptions(kinds=("dry",)))),
                        (MicroOptions(kinds=("dry",), max_model_len=4096), 4096)):
        v2 = [impl for impl in _impls(case, opts, torch.device("cpu"), set()) if isinstance(impl, _V2Adapter)]
        assert [impl.harness.all_token_ids.gpu.shape[1] for impl in v2] == [width]
    need = history_len("dry", MicroOptions(kinds=("dry",)))
    with pytest.raises(ValueError, match=rf"--max-model-len {need - 1}: .* at least {need} tokens"):
        MicroOptions(kinds=("dry",), max_model_len=need - 1)
    MicroOptions(kinds=("dry",), max_model_len=need)  # exactly the history fits
