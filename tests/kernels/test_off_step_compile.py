"""A kernel variant compiled off the engine step (``FusedGate.run(..., variant=, compile=)``,
``dynlogits.kernels.variants``): on CUDA a new variant's first call runs eager without waiting for
its compile, which runs once on a background thread; calls after it lands run fused; a failing
compile leaves that variant eager with one warning; variants are independent; the probe path, the
CPU and the CUDA model are as before. CUDA devices here are ``torch.device`` objects only (no GPU):
the gate never touches them, the injected callables stand in for the kernels."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dynlogits.kernels import banned_phrases as banned_phrases_kernels
from dynlogits.kernels import dead_rows as dead_rows_kernels
from dynlogits.kernels import dry as dry_kernels
from dynlogits.kernels import forced as forced_kernels
from dynlogits.kernels import multiple_choice as multiple_choice_kernels
from dynlogits.kernels import no_repeat_ngram as no_repeat_ngram_kernels
from dynlogits.kernels import spans as spans_kernels
from dynlogits.kernels import thinking_force as thinking_force_kernels
from dynlogits.kernels import variants
from dynlogits.kernels.probe import FusedGate
from dynlogits.kernels.variants import CompileThread

CUDA = torch.device("cuda", 0)


class Compile:
    """A compile callable counting its calls; it blocks until ``release`` is set (set by default)
    and raises where ``error`` is given."""

    def __init__(self, *, blocked: bool = False, error: Exception | None = None) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        if not blocked:
            self.release.set()
        self.error = error

    def __call__(self) -> None:
        self.calls += 1
        self.started.set()
        assert self.release.wait(timeout=30), "the test never released the compile"
        if self.error is not None:
            raise self.error


def _gate(compiler: CompileThread, probe: Callable[[torch.device], bool] = lambda device: True) -> FusedGate:
    return FusedGate("test_kind", probe, compiler)


def _run(gate: FusedGate, variant: object, compile_: Compile, device: torch.device = CUDA) -> str:
    return gate.run(device, lambda: "fused", lambda: "eager", variant, compile_)


def test_a_new_variant_runs_eager_without_waiting_for_its_compile_then_fused_once_landed() -> None:
    compiler = CompileThread()
    gate = _gate(compiler)
    compile_ = Compile(blocked=True)
    assert _run(gate, ("size", 3), compile_) == "eager"  # returned while the compile is held
    assert compile_.started.wait(timeout=30)
    assert [_run(gate, ("size", 3), compile_) for _ in range(3)] == ["eager"] * 3  # still compiling
    compile_.release.set()
    assert compiler.join(timeout=30)
    assert [_run(gate, ("size", 3), compile_) for _ in range(3)] == ["fused"] * 3
    assert compile_.calls == 1  # queued once, however many calls came before it landed


def test_a_failing_compile_leaves_that_variant_eager_for_good_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    compiler = CompileThread()
    gate = _gate(compiler)
    failing = Compile(error=RuntimeError("ptxas: out of registers\nmore"))
    with caplog.at_level("WARNING", logger="dynlogits.kernels"):
        assert _run(gate, ("size", 7), failing) == "eager"
        assert compiler.join(timeout=30)
        assert [_run(gate, ("size", 7), failing) for _ in range(3)] == ["eager"] * 3
        assert compiler.join(timeout=30)
    assert failing.calls == 1
    warned = [r.getMessage() for r in caplog.records if "failed to compile" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("test_kind") and "ptxas: out of registers" in warned[0]
    assert "more" not in warned[0]
    assert gate.run(CUDA, lambda: "fused", lambda: "eager") == "fused"  # the kind's other launches: untouched


def test_two_variants_compile_independently_and_per_device() -> None:
    compiler = CompileThread()
    gate = _gate(compiler)
    failing, landing, other_device = Compile(error=ValueError("bad")), Compile(), Compile(blocked=True)
    assert _run(gate, "a", failing) == "eager" and _run(gate, "b", landing) == "eager"
    assert compiler.join(timeout=30)
    assert _run(gate, "a", failing) == "eager" and _run(gate, "b", landing) == "fused"
    second = torch.device("cuda", 1)  # the same variant on another device compiles there on its own
    assert _run(gate, "b", other_device, second) == "eager"
    assert _run(gate, "b", landing) == "fused"
    other_device.release.set()
    assert compiler.join(timeout=30)
    assert _run(gate, "b", other_device, second) == "fused"
    assert (failing.calls, landing.calls, other_device.calls) == (1, 1, 1)


def test_calls_from_many_threads_queue_one_compile_a_variant() -> None:
    compiler = CompileThread()
    gate = _gate(compiler)
    compile_ = Compile(blocked=True)
    start = threading.Barrier(8)
    answers: list[str] = []

    def call() -> None:
        start.wait(timeout=30)
        answers.extend(_run(gate, "v", compile_) for _ in range(50))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == ["eager"] * 400
    compile_.release.set()
    assert compiler.join(timeout=30)
    assert compile_.calls == 1 and _run(gate, "v", compile_) == "fused"

def test_a_full_queue_runs_eager_and_asks_again_at_a_later_call() -> None:
    compiler = CompileThread(capacity=1)
    gate = _gate(compiler)
    holding, queued, refused = Compile(blocked=True), Compile(), Compile()
    assert _run(gate, "held", holding) == "eager"
    assert holding.started.wait(timeout=30)  # the thread holds it: the queue is empty again
    assert _run(gate, "queued", queued) == "eager"  # fills the queue
    assert _run(gate, "refused", refused) == "eager"  # refused: not marked pending
    holding.release.set()
    assert compiler.join(timeout=30)
    assert refused.calls == 0 and _run(gate, "queued", queued) == "fused"
    assert _run(gate, "refused", refused) == "eager"  # asked again, queued this time
    assert compiler.join(timeout=30)
    assert refused.calls == 1 and _run(gate, "refused", refused) == "fused"


def test_the_probe_the_cpu_and_the_cuda_model_are_unchanged() -> None:
    compiler = CompileThread()
    compile_ = Compile()
    probed: list[torch.device] = []

    def failing_probe(device: torch.device) -> bool:
        probed.append(device)
        return False

    off = _gate(compiler, failing_probe)
    assert [_run(off, "v", compile_) for _ in range(2)] == ["eager"] * 2 and probed == [CUDA]
    on = _gate(compiler)
    assert on.run(CUDA, lambda: "fused", lambda: "eager") == "fused"  # no variant named: as before
    assert _run(on, "v", compile_, torch.device("cpu")) == "eager"
    assert _run(on, "v", compile_, torch.device("meta")) == "fused"  # the CUDA model: no compile to wait for
    assert compiler.join(timeout=30)
    assert compile_.calls == 0


def test_run_named_derives_the_variant_only_where_the_gate_reads_it() -> None:
    """``run_named(..., variant_of, *args)``: ``variant_of(*args)`` is called on CUDA with the
    kernels on (then as ``run`` with its pair), never on the CPU, in the CUDA model or after a
    failed probe, where no step pays for naming a variant."""
    compiler = CompileThread()
    compile_ = Compile()
    named: list[tuple[object, ...]] = []

    def variant_of(*args: object) -> tuple[Hashable, Callable[[], object]]:
        named.append(args)
        return ("v", *args), compile_

    def run_named(gate: FusedGate, device: torch.device) -> str:
        return gate.run_named(device, lambda: "fused", lambda: "eager", variant_of, 3, "drafts")

    on, off = _gate(compiler), _gate(compiler, lambda device: False)
    assert run_named(on, torch.device("cpu")) == "eager" and run_named(on, torch.device("meta")) == "fused"
    assert run_named(off, CUDA) == "eager"
    assert named == [] and compile_.calls == 0
    assert run_named(on, CUDA) == "eager"  # the variant's first call: compiled off the step
    assert compiler.join(timeout=30)
    assert run_named(on, CUDA) == "fused"
    assert named == [(3, "drafts")] * 2 and compile_.calls == 1


def test_reset_forgets_the_variants() -> None:
    compiler = CompileThread()
    gate = _gate(compiler)
    compile_ = Compile()
    _run(gate, "v", compile_)
    assert compiler.join(timeout=30)
    assert _run(gate, "v", compile_) == "fused"
    gate.reset()
    assert _run(gate, "v", compile_) == "eager"
    assert compiler.join(timeout=30)
    assert compile_.calls == 2 and _run(gate, "v", compile_) == "fused"


def test_a_job_that_raises_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    compiler = CompileThread()
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    with caplog.at_level("ERROR", logger="dynlogits.kernels"):
        assert compiler.submit(boom) and compiler.submit(ran.set)
        assert compiler.join(timeout=30)
    assert ran.is_set() and any("compile job failed" in r.getMessage() for r in caplog.records)


# -- no_repeat_ngram's variant and compile --

class _Recorder:
    """Stands in for the jitted kernel: records a launch (``[grid](...)``) and a ``warmup``."""

    def __init__(self) -> None:
        self.launched: tuple[tuple[object, ...], dict[str, object]] | None = None
        self.warmed: tuple[tuple[object, ...], dict[str, object]] | None = None

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            self.launched = (args, kwargs)

        return launch

    def warmup(self, *args: object, grid: object, **kwargs: object) -> None:
        self.warmed = (args, kwargs)


def _recorded(monkeypatch: pytest.MonkeyPatch, kernels: Any, kernel: str) -> _Recorder:
    """A recorder in place of ``kernels``' jitted ``kernel``."""
    recorder = _Recorder()
    monkeypatch.setattr(kernels, "kernels", lambda: SimpleNamespace(**{kernel: recorder}))
    return recorder


def _as_warmed(launched: tuple[tuple[object, ...], dict[str, object]]) -> tuple[tuple[object, ...], dict[str, object]]:
    """A launch's arguments as its compile's ``warmup`` gets them: each tensor its dtype."""
    return tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in launched[0]), launched[1]


def _warmed_as_launched(monkeypatch: pytest.MonkeyPatch, recorder: _Recorder, launch: Callable[[], object],
                        named: Callable[[], tuple[Hashable, Callable[[], object]]]) -> Hashable:
    """``launch()`` and the compile ``named()`` gives, both into ``recorder``: the compile's ``warmup``
    gets the launch's arguments (tensors as dtypes) and constexprs. Then the real kernels back
    (``monkeypatch.undo``: their params say which ints Triton keys) and the variant ``named()`` gives."""
    launch()
    named()[1]()
    assert recorder.launched is not None and recorder.warmed == _as_warmed(recorder.launched)
    monkeypatch.undo()
    return named()[0]


def _call_site(monkeypatch: pytest.MonkeyPatch, kernels: Any, kernel: str, constexpr: str, processors: Any,
               gate: str, kind: str) -> tuple[list[object], CompileThread]:
    """``kernels``' jitted ``kernel`` replaced by a recorder whose ``warmup`` notes its ``constexpr``,
    and ``processors``' gate ``gate`` by a fresh one (named ``kind``, probe passing) on its own
    compile thread: what the warmups noted, and that thread."""
    recorder = _Recorder()
    warmed: list[object] = []
    recorder.warmup = lambda *args, grid, **kwargs: warmed.append(kwargs[constexpr])  # type: ignore[method-assign]  # the recorder's warmup stands in for Triton's
    monkeypatch.setattr(kernels, "kernels", lambda: SimpleNamespace(**{kernel: recorder}))
    compiler = CompileThread()
    monkeypatch.setattr(processors, gate, FusedGate(kind, lambda device: True, compiler))
    return warmed, compiler


@pytest.mark.parametrize("drafts", [0, 2])
@pytest.mark.parametrize("floored", [False, True])
def test_no_repeat_ngram_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, drafts: int, floored: bool) -> None:
    """The compile's ``warmup`` gets the launch's arguments with each tensor replaced by its dtype,
    and the same ints and constexprs (so Triton keys both alike)."""

    from dynlogits.kernels import no_repeat_ngram as kernels
    from dynlogits.processors.no_repeat_ngram_device import probe_case

    recorder = _recorded(monkeypatch, kernels, "ban_rows")
    window, t, logits, floor = probe_case(7, torch.device("cpu"), drafts=drafts)
    args = (logits, window.tokens, window.pos, t.slot_of_row, t.source.params,
            window.input_ids if drafts else None, window.local_pos if drafts else None, floor if floored else None,
            t.source.width, t.source.size)
    kernels.ban_(*args)
    variant, compile_ = no_repeat_ngram_kernels.variant(*args)
    compile_()
    assert recorder.launched is not None and recorder.warmed == _as_warmed(recorder.launched)
    other, _ = no_repeat_ngram_kernels.variant(*args[:-1], t.source.size + 1)
    assert variant == no_repeat_ngram_kernels.variant(*args)[0] and other != variant


def test_no_repeat_ngram_s_call_site_runs_eager_until_its_variant_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply``'s CUDA path (``_gated``) names the launch's variant: the first step of a size runs
    ``apply_eager`` while the compile (a ``warmup`` of that size) runs on the thread, later steps the
    fused op; another size starts over. (Fused and eager write the same logits:
    ``test_no_repeat_ngram_kernels``, the CPU implementation against ``apply_eager`` and the kernel in
    Triton's interpreter against the CPU implementation, bit for bit.)"""

    from dynlogits.kernels import no_repeat_ngram as kernels
    from dynlogits.processors import no_repeat_ngram_device as D

    warmed, compiler = _call_site(monkeypatch, kernels, "ban_rows", "SIZE", D, "_GATE", "no_repeat_ngram")
    fused: list[int] = []
    monkeypatch.setattr(D, "ban_", lambda *args: fused.append(args[-1]))
    window, t, logits, _ = D.probe_case(3, torch.device("cpu"))
    size = t.source.size
    args = (logits, window.tokens, window.pos, t.slot_of_row, t.source.params, None, None, None, t.source.width, size)
    eager: list[int] = []
    D._gated(CUDA, args, lambda: eager.append(size))
    assert compiler.join(timeout=30)
    D._gated(CUDA, args, lambda: eager.append(size))
    D._gated(CUDA, (*args[:-1], size + 1), lambda: eager.append(size + 1))
    assert compiler.join(timeout=30)
    assert eager == [size, size + 1] and fused == [size] and warmed == [size, size + 1]


@pytest.mark.parametrize(("drafts", "floors", "width"), [(0, False, 5), (2, False, 12), (0, True, 40), (3, True, 1)])
def test_banned_phrases_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, drafts: int, floors: bool, width: int) -> None:
    """As for ``no_repeat_ngram``: ``launch``'s arguments with tensors as dtypes, the same ints and
    constexprs; the phrase-length bucket (``BLOCK_W``) is part of the variant."""

    from dynlogits.kernels import banned_phrases as kernels

    recorder = _recorded(monkeypatch, kernels, "ban_rows")
    case = kernels.probe_case(11, drafts=drafts, width=width, floors=floors)
    kernels.launch(*case)
    variant, compile_ = banned_phrases_kernels.variant(*case)
    compile_()
    assert recorder.launched is not None and recorder.warmed == _as_warmed(recorder.launched)
    wider = 40 if width <= 8 else 1  # the other BLOCK_W bucket
    assert banned_phrases_kernels.variant(*case[:-1], wider)[0] != variant
    assert banned_phrases_kernels.variant(*case)[0] == variant


def test_a_variant_is_its_constexprs_dtypes_and_int_classes() -> None:
    """Ints that Triton keys alike (neither 1 nor a multiple of 16, or both multiples of 16) give one
    variant; a dtype, an int class or a constexpr apart, another."""
    def key(*args: object, size: int = 3) -> object:
        return variants.launch_variant("k", lambda: None, torch.device("cpu"), args, {"SIZE": size})[0]

    f32, i64 = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    assert key(f32, 17) == key(torch.ones(5), 33) == key(f32, 8) and key(f32, 32) == key(f32, 16)
    assert len({key(f32, 17), key(f32, 16), key(f32, 1), key(i64, 17), key(f32, 17, size=4)}) == 5


def test_an_int_the_kernel_leaves_unkeyed_never_makes_a_new_variant() -> None:
    """The real kernels put their per-step ints (window width, vocab, strides) in
    ``do_not_specialize``, so Triton compiles one variant whatever their values: the variant key
    ignores them too (a width of 16 then 17 must not send a step eager for a compile Triton would
    not do), while keeping the ints Triton does key (an innermost stride of 1)."""
    from dynlogits.kernels import no_repeat_ngram as kernels
    from dynlogits.processors.no_repeat_ngram_device import probe_case

    window, t, logits, _ = probe_case(5, torch.device("cpu"))
    args = (logits, window.tokens, window.pos, t.slot_of_row, t.source.params, None, None, None)
    size = t.source.size
    wide = [no_repeat_ngram_kernels.variant(*args, width, size)[0] for width in (size + 15, 16, 17, 32)]
    assert len(set(wide)) == 1
    ban_rows = kernels.kernels().ban_rows
    keyed = [p.name for p in ban_rows.params if not p.is_constexpr and not p.do_not_specialize
             and p.name.endswith(("_s0", "_s1", "maxlen", "width", "vocab"))]
    assert keyed == ["logits_s1", "tokens_s1"]  # innermost strides: 1 in every launch, keyed alike


@pytest.mark.parametrize(("drafts", "floored"), [(False, False), (True, False), (False, True)])
def test_dry_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, drafts: bool, floored: bool) -> None:
    """As for ``no_repeat_ngram``: ``decide``'s launch arguments with tensors as dtypes (its outputs
    as meta tensors), the same ints and constexprs; the look-back bucket (``TAIL``) and the breaker
    bucket (``LOG_S``) are part of the variant, the window width is not."""

    from dynlogits.kernels import dry as kernels
    from dynlogits.processors import dry_device as D

    recorder = _recorded(monkeypatch, kernels, "decide_rows")
    args, width, cap = D.probe_case(4, drafts=drafts)
    floor = D.probe_floor(4, list(args)) if floored else None
    variant = _warmed_as_launched(monkeypatch, recorder, lambda: kernels.decide(*args, width, cap, floor), lambda: dry_kernels.variant(*args, width, cap, floor))
    assert dry_kernels.variant(*args, width + 17, cap, floor)[0] == variant  # the width: unkeyed
    assert dry_kernels.variant(*args, width, 2 * cap + 16, floor)[0] != variant  # another look-back bucket


def test_dry_s_gate_runs_eager_until_the_launch_s_variant_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dry_device.fused_run`` hands the group's variant (its ``variant_of`` for the launch's
    arguments) and compile to the kind's gate: eager for
    the step that first holds the variant, fused once its compile has landed."""
    from dynlogits.processors import dry_device as D

    compiler = CompileThread()
    monkeypatch.setattr(D, "_GATE", FusedGate("dry", lambda device: True, compiler))
    ran: list[str] = []
    compiled: list[str] = []
    for _ in range(2):
        D.fused_run(CUDA, lambda: ran.append("fused"), lambda: ran.append("eager"),
                    lambda width: (("dry", width), lambda: compiled.append(f"dry {width}")), 32)
        assert compiler.join(timeout=30)
    assert ran == ["eager", "fused"] and compiled == ["dry 32"]


@pytest.mark.parametrize(("drafts", "width", "chunk"), [(0, 5, 16384), (2, 12, 16), (3, 1, 16384)])
def test_multiple_choice_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, drafts: int, width: int, chunk: int) -> None:
    """As for ``no_repeat_ngram``: ``launch``'s arguments with tensors as dtypes (its scratch as
    meta tensors), the same ints, constexprs and ``num_warps``; the choice-length bucket
    (``BLOCK_W``) and the logits' dtype are part of the variant, the entry count is not."""

    from dynlogits.kernels import multiple_choice as kernels

    recorder = _recorded(monkeypatch, kernels, "keep_rows")
    case = kernels.probe_case(13, drafts=drafts, width=width)
    variant = _warmed_as_launched(monkeypatch, recorder, lambda: kernels.launch(*case), lambda: multiple_choice_kernels.variant(*case))
    wider = 40 if width <= 8 else 1  # the other BLOCK_W bucket
    assert multiple_choice_kernels.variant(*case[:-1], wider)[0] != variant
    assert multiple_choice_kernels.variant(*case[:-2], case.entries + 17, case.width)[0] == variant
    half = case._replace(logits=case.logits.to(torch.bfloat16))
    assert multiple_choice_kernels.variant(*half)[0] != variant


def test_multiple_choice_s_call_site_runs_eager_until_its_variant_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_keep_fused``'s gate (``_gated``) names the launch's variant on CUDA: the step that first
    holds a choice-length bucket runs the eager keep while its compile (a ``warmup`` of that bucket)
    runs on the thread, later steps the fused op; another bucket starts over."""

    from dynlogits.kernels import multiple_choice as kernels
    from dynlogits.processors import multiple_choice as P

    warmed, compiler = _call_site(monkeypatch, kernels, "keep_rows", "BLOCK_W", P, "GATE", "multiple_choice")
    fused: list[int] = []
    monkeypatch.setattr(P, "multiple_choice_keep_", lambda *args: fused.append(args[-1]))
    eager: list[int] = []
    case = kernels.probe_case(5, width=5)

    def step(width: int) -> None:
        P._gated(CUDA, tuple(case._replace(width=width)), lambda: eager.append(width))

    step(5)
    assert compiler.join(timeout=30)
    step(5)
    step(12)
    assert compiler.join(timeout=30)
    assert eager == [5, 12] and fused == [5] and warmed == [8, 32]


@pytest.mark.parametrize(("pick", "stops"), [(False, False), (False, True), (True, False), (True, True)])
def test_forced_compile_warms_up_both_launches_own_specializations(
        monkeypatch: pytest.MonkeyPatch, pick: bool, stops: bool) -> None:
    """``settle_`` and ``pick_settle_`` launch twice (a decision, then the fill): their variant is the
    pair of both launches' keys and their compile warms each launch's own arguments (tensors as
    dtypes, the same ints and constexprs); whether the rows can stop is part of it, the row count
    is not."""
    from types import SimpleNamespace

    from dynlogits.kernels import forced as kernels
    from dynlogits.processors import forced_settle as F

    recorders = {name: _Recorder() for name in ("decide_rows", "pick_decide_rows", "fill_rows")}
    monkeypatch.setattr(kernels, "kernels", lambda: SimpleNamespace(**recorders))
    cpu = torch.device("cpu")
    if pick:
        case = F.pick_probe_case(9, cpu, stops=stops, dtype=torch.int32)
        n = case[1].shape[0]
        args: tuple[object, ...] = (*case, torch.empty((6, n), dtype=torch.long), torch.empty((3, n), dtype=torch.long),
                                    torch.empty(n, dtype=torch.bool))
        launch, named, first = kernels.pick_settle_, forced_kernels.pick_settle_variant, "pick_decide_rows"
    else:
        logits, rows, picked, if_dead, can_stop = F.probe_case(9, cpu, stops=stops)
        args = (logits, rows, picked, if_dead, can_stop, torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
        launch, named, first = kernels.settle_, forced_kernels.settle_variant, "decide_rows"
    launch(*args)  # type: ignore[operator]  # the parametrized callable is typed object
    variant, compile_ = named(*args)  # type: ignore[operator]  # the parametrized callable is typed object
    compile_()
    for name in (first, "fill_rows"):
        launched, warmed = recorders[name].launched, recorders[name].warmed
        assert launched is not None and warmed == _as_warmed(launched)
    assert isinstance(variant, tuple) and len(variant) == 2
    monkeypatch.undo()  # the real kernels: their params say which ints Triton keys
    variant = named(*args)[0]  # type: ignore[operator]  # the parametrized callable is typed object
    stop_at = 6 if pick else 4
    flipped = None if stops else torch.ones(args[1].shape[0], dtype=torch.bool)  # type: ignore[union-attr]  # args is a tuple of mixed types
    assert named(*args[:stop_at], flipped, *args[stop_at + 1:])[0] != variant  # type: ignore[operator]  # the parametrized callable is typed object
    fewer = tuple(a[..., :5] if isinstance(a, torch.Tensor) and a.dim() and a is not args[0] else a for a in args)
    assert named(*fewer)[0] == variant  # type: ignore[operator]  # the parametrized callable is typed object


def test_forced_s_call_sites_run_eager_until_their_variants_land(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_settle`` and ``run_pick_settle`` (``ForcedSequenceGroup``'s fused settles) name their
    two launches' variant on CUDA: eager for the step that first holds it while both launches
    compile on the thread, fused after; the other op's variant is its own."""
    from types import SimpleNamespace

    from dynlogits.kernels import forced as kernels
    from dynlogits.processors import forced_settle as F

    warmed: list[str] = []
    recorders = {}
    for name in ("decide_rows", "pick_decide_rows", "fill_rows"):
        recorders[name] = _Recorder()
        recorders[name].warmup = lambda *a, grid, _name=name, **k: warmed.append(_name)  # type: ignore[method-assign]  # the recorder's warmup stands in for Triton's
    monkeypatch.setattr(kernels, "kernels", lambda: SimpleNamespace(**recorders))
    compiler = CompileThread()
    monkeypatch.setattr(F, "_GATE", FusedGate("forced_sequence", lambda device: True, compiler))
    ran: list[str] = []
    monkeypatch.setattr(F, "settle_", _Op("settle", ran))
    monkeypatch.setattr(F, "pick_settle_", _Op("pick", ran))
    cpu = torch.device("cpu")
    logits, rows, picked, if_dead, can_stop = F.probe_case(9, cpu)
    settle = (logits, rows, picked, if_dead, can_stop, torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
    case = F.pick_probe_case(9, cpu)
    n = case[1].shape[0]
    pick = (*case, torch.empty((6, n), dtype=torch.long), torch.empty((3, n), dtype=torch.long),
            torch.empty(n, dtype=torch.bool))
    for _ in range(2):
        F.run_settle(CUDA, settle)
        F.run_pick_settle(CUDA, pick)
        assert compiler.join(timeout=30)
    assert ran == ["settle eager", "pick eager", "settle fused", "pick fused"]
    assert warmed == ["decide_rows", "fill_rows", "pick_decide_rows", "fill_rows"]


class _Op:
    """Stands in for a fused op: a call records ``<name> fused``, ``eager`` ``<name> eager``."""

    def __init__(self, name: str, ran: list[str]) -> None:
        self.name, self.ran = name, ran

    def __call__(self, *args: object) -> None:
        self.ran.append(f"{self.name} fused")

    def eager(self, *args: object) -> None:
        self.ran.append(f"{self.name} eager")


@pytest.mark.parametrize(("positions", "drafts", "dtype"), [(True, False, torch.float32), (False, True, torch.bfloat16)])
def test_thinking_force_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, positions: bool, drafts: bool, dtype: torch.dtype) -> None:
    """As for ``no_repeat_ngram``: ``launch``'s arguments with tensors as dtypes, the same ints and
    constexprs; whether positions and a real-row mask are given is part of the variant, the sentinel
    (a slot count) is not."""

    from dynlogits.kernels import thinking_force as kernels

    recorder = _recorded(monkeypatch, kernels, "settle_rows")
    logits, decisions, member, slot_of_row, stops, pos, sentinel, flags, dead, real = kernels.probe_case(3, dtype=dtype)
    pos = pos if positions else torch.empty(0, dtype=torch.long)
    real = real if drafts else torch.empty(0, dtype=torch.bool)
    args = (logits, decisions, member, slot_of_row, stops, pos, sentinel, flags, dead, real, kernels.NO_SEQUENCE,
            kernels.NO_SEQUENCE, False)
    variant = _warmed_as_launched(monkeypatch, recorder, lambda: kernels.launch(*args), lambda: thinking_force_kernels.variant(*args))
    assert thinking_force_kernels.variant(*args[:6], sentinel + 17, *args[7:])[0] == variant
    other_real = torch.empty(0, dtype=torch.bool) if drafts else torch.ones(len(decisions), dtype=torch.bool)
    assert thinking_force_kernels.variant(*args[:9], other_real, *args[10:])[0] != variant


@pytest.mark.parametrize(("listed", "stops", "real"), [(True, True, False), (False, True, True), (False, False, False)])
def test_dead_rows_compile_warms_up_the_launch_s_own_specialization(
        monkeypatch: pytest.MonkeyPatch, listed: bool, stops: bool, real: bool) -> None:
    """As for ``no_repeat_ngram``: ``launch``'s arguments with tensors as dtypes, the same ints and
    constexprs; the layout (listed or gathered) is part of the variant, the witness width is not."""

    from dynlogits.kernels import dead_rows as kernels

    recorder = _recorded(monkeypatch, kernels, "dead_rows")
    case = kernels.probe_case(4, torch.device("cpu"), listed=listed, stops=stops, real=real)
    variant = _warmed_as_launched(monkeypatch, recorder, lambda: kernels.launch(*case), lambda: dead_rows_kernels.variant(*case))
    wider = kernels.probe_case(4, torch.device("cpu"), listed=listed, stops=stops, real=real, width=17)
    assert dead_rows_kernels.variant(*wider)[0] == variant
    other = kernels.probe_case(4, torch.device("cpu"), listed=not listed, stops=stops, real=real)
    assert dead_rows_kernels.variant(*other)[0] != variant


def test_thinking_force_and_dead_rows_call_sites_run_eager_until_their_variants_land(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``thinking_force.run_gated`` (``SettledForcing``'s and a forced sequence's fused settle) and ``failures._gated``
    (``Failures``' dead-row settle) name their launch's variant on CUDA: eager for the step that
    first holds it while it compiles on the thread (a ``warmup`` of that launch), fused after."""
    from types import SimpleNamespace

    from dynlogits.kernels import dead_rows, thinking_force
    from dynlogits.sdk.resident import failures

    warmed: list[str] = []
    recorders = {}
    for module, name in ((thinking_force, "settle_rows"), (dead_rows, "dead_rows")):
        recorder = recorders[name] = _Recorder()
        recorder.warmup = lambda *a, grid, _name=name, **k: warmed.append(_name)  # type: ignore[method-assign]  # the recorder's warmup stands in for Triton's
        monkeypatch.setattr(module, "kernels", lambda _name=name: SimpleNamespace(**{_name: recorders[_name]}))
    compiler = CompileThread()
    monkeypatch.setattr(thinking_force, "GATE", FusedGate("span-decided forcing", lambda device: True, compiler))
    monkeypatch.setattr(failures, "GATE", FusedGate("restrictive dead rows", lambda device: True, compiler))
    ran: list[str] = []
    monkeypatch.setattr(failures, "dead_rows_", lambda *args: ran.append("dead fused"))
    settle = (*thinking_force.probe_case(2), thinking_force.NO_SEQUENCE, thinking_force.NO_SEQUENCE, False)
    dead = dead_rows.probe_case(2, torch.device("cpu"), listed=True)
    for _ in range(2):
        thinking_force.run_gated(CUDA, settle, lambda: ran.append("force fused"), lambda: ran.append("force eager"))
        failures._gated(CUDA, dead, lambda: ran.append("dead eager"))
        assert compiler.join(timeout=30)
    assert ran == ["force eager", "dead eager", "force fused", "dead fused"]
    assert warmed == ["settle_rows", "dead_rows"]


def _span_ops(width: int = 3, rule: int = 1) -> tuple[tuple[object, ...], ...]:
    """One argument tuple of each span op form: an advance, a restarted advance, drafts, restarted
    drafts (``dynlogits.kernels.spans``' cases)."""
    from dynlogits.kernels import spans

    state, consts, tokens, total_len, scale = spans.probe_case(2, width=width)
    decided, force, force_len = spans.force_case(2, width=width)
    restart, epoch, scope, prompt_len = spans.restart_case(2)
    advance = (state, consts, tokens, total_len, scale, width, 2, decided, force, force_len, rule)
    (d_state, d_consts, d_tokens, d_total, d_scale, slots, member, input_ids, local, d_force, d_len, *outputs) = \
        spans.drafts_case(2, width=width)
    drafts = (d_state, d_consts, d_tokens, d_total, d_scale, width, slots, member, input_ids, local, 2, *outputs,
              d_force, d_len, rule)
    stage = (restart, epoch, scope[slots.clamp(max=d_state.shape[0] - 1)].contiguous(), prompt_len[: d_tokens.shape[0]])
    return advance, (*advance, restart, epoch, scope, prompt_len), drafts, (*drafts, *stage)


def test_span_ops_compile_warms_up_every_launch_s_own_specialization(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spans_kernels.variant`` over the ops one gated call makes (advances, then drafts): the tuple
    of each launch's key, and a compile warming each launch's kernel (plain or restarted) with its
    own arguments, tensors as dtypes; the table width (``WIDTH``) is part of the variant, the row
    count is not; an advance that launches nothing is left out."""
    from types import SimpleNamespace

    from dynlogits.kernels import spans

    names = ("advance_rows", "restarted_advance_rows", "drafts_rows", "restarted_drafts_rows")
    recorders = {name: _Recorder() for name in names}
    monkeypatch.setattr(spans, "kernels", lambda: SimpleNamespace(**recorders))
    advance, restarted, drafts, restarted_drafts = _span_ops()
    spans.launch(*advance)  # type: ignore[arg-type]  # args is a tuple of mixed types
    spans.launch(*restarted)  # type: ignore[arg-type]  # args is a tuple of mixed types
    spans.launch_drafts(*drafts)  # type: ignore[arg-type]  # args is a tuple of mixed types
    spans.launch_drafts(*restarted_drafts)  # type: ignore[arg-type]  # args is a tuple of mixed types
    variant, compile_ = spans_kernels.variant([advance, restarted], [drafts, restarted_drafts])
    compile_()
    for name in names:
        launched = recorders[name].launched
        assert launched is not None and recorders[name].warmed == _as_warmed(launched), name
    assert isinstance(variant, tuple) and len(variant) == 4
    monkeypatch.undo()  # the real kernels: their params say which ints Triton keys
    variant = spans_kernels.variant([advance], [drafts])[0]
    wider = _span_ops(width=4)
    assert spans_kernels.variant([wider[0]], [wider[2]])[0] != variant
    fewer = tuple(a[:17] if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == 40 else a for a in advance)
    assert spans_kernels.variant([fewer], [drafts])[0] == variant
    idle = (*advance[:6], 0, *advance[7:10], 0)  # no rounds, no rule, no restart: no launch
    assert spans_kernels.variant([idle, advance], [drafts])[0] == variant


def test_span_call_sites_run_eager_until_their_variants_land(monkeypatch: pytest.MonkeyPatch) -> None:
    """``device_thinking.gated_spans`` (every span table's fused step, the drafted decisions, the
    stretch tables' two drafted ops) names the ops' launches on CUDA: eager for the step that first
    holds the variant while every launch compiles on the thread, fused after; another table width
    starts over."""
    from types import SimpleNamespace

    from dynlogits.kernels import spans
    from dynlogits.processors import device_thinking

    warmed: list[str] = []
    recorders = {}
    for name in ("advance_rows", "restarted_advance_rows", "drafts_rows", "restarted_drafts_rows"):
        recorders[name] = _Recorder()
        recorders[name].warmup = lambda *a, grid, _name=name, **k: warmed.append(_name)  # type: ignore[method-assign]  # the recorder's warmup stands in for Triton's
    monkeypatch.setattr(spans, "kernels", lambda: SimpleNamespace(**recorders))
    compiler = CompileThread()
    monkeypatch.setattr(device_thinking, "GATE", FusedGate("span following", lambda device: True, compiler))
    ran: list[str] = []
    advance, restarted, drafts, restarted_drafts = _span_ops()
    wide = _span_ops(width=4)
    for _ in range(2):
        device_thinking.gated_spans(CUDA, [advance, restarted], (), lambda: ran.append("step fused"),
                                    lambda: ran.append("step eager"))
        device_thinking.gated_spans(CUDA, (), [drafts, restarted_drafts], lambda: ran.append("drafts fused"),
                                    lambda: ran.append("drafts eager"))
        assert compiler.join(timeout=30)
    device_thinking.gated_spans(CUDA, [wide[0]], (), lambda: ran.append("wide fused"), lambda: ran.append("wide eager"))
    assert compiler.join(timeout=30)
    assert ran == ["step eager", "drafts eager", "step fused", "drafts fused", "wide eager"]
    assert warmed == ["advance_rows", "restarted_advance_rows", "drafts_rows", "restarted_drafts_rows", "advance_rows"]


# -- watermark's draw and window decisions --

@pytest.mark.parametrize("runner", ["v1", "v2", "v2-drafts"])
def test_watermark_call_sites_name_what_their_launches_compile(monkeypatch: pytest.MonkeyPatch, runner: str) -> None:
    """Driven as vLLM's runners drive the adapter (the CUDA model), each fused op's ``variant_of``
    and arguments recorded where the group hands them to its gate (``fused_run``): the warmup of each named
    variant gets what the kernels' launcher launches for the same arguments, tensors as dtypes. The
    window's variant carries the group's widest context width (``WIDE``), so a client's width
    compiles off the step; the V1 runner's draw forces every row it gets, Model Runner V2's those
    that fire."""
    from dynlogits.kernels import watermark as kernels
    from dynlogits.processors import watermark_resident as R
    from dynlogits.testing.cuda.drive import Scenario, drive_v1, drive_v2
    from dynlogits.testing.cuda.simcuda import SimCuda

    named: list[tuple[Callable[..., tuple[Hashable, Callable[[], object]]], tuple[object, ...]]] = []

    gated = R.fused_run

    def recorded(device: torch.device, fused: Callable[[], object], eager: Callable[[], object],
                 variant: Callable[..., tuple[Hashable, Callable[[], object]]], *args: object) -> object:
        named.append((variant, args))
        return gated(device, fused, eager, variant, *args)

    monkeypatch.setattr(R, "fused_run", recorded)
    scenario = Scenario(payloads=[[{"kind": "watermark", "key": 7, "context_width": w}] for w in (3, 5)], steps=6,
                        changes=False)  # drive_v2's drafts come from step 4 on
    recorders = {name: _Recorder() for name in ("draw_blocks", "draw_reduce", "window_decide")}
    constexprs: dict[str, set[object]] = {}
    with SimCuda() as sim:
        result = drive_v1(sim, scenario) if runner == "v1" else drive_v2(sim, scenario, drafts=2 * (runner == "v2-drafts"))
        assert not result.failures and named
        monkeypatch.setattr(kernels, "kernels", lambda: SimpleNamespace(**recorders))
        for variant, args in named:  # the device's tensors are the model's: read inside its context
            launches = ("draw_blocks", "draw_reduce") if variant is kernels.draw_variant else ("window_decide",)
            launcher: Callable[..., object] = kernels.draw if variant is kernels.draw_variant else kernels.window_state
            launcher(*args)
            variant(*args)[1]()
            for name in launches:
                launched = recorders[name].launched
                assert launched is not None and recorders[name].warmed == _as_warmed(launched), name
                for constexpr, value in launched[1].items():
                    constexprs.setdefault(constexpr, set()).add(value)
    assert constexprs["HAS_FIRE"] == {runner != "v1"} and constexprs["FORCE"] == {True}
    if runner == "v1":
        assert "WIDE" not in constexprs  # the V1 runner's contexts are read on the host
    else:
        assert constexprs["WIDE"] == {5} and constexprs["EVERY"] == {False}
        assert constexprs["DRAFTS"] == ({False, True} if runner == "v2-drafts" else {False})


def test_watermark_variants_follow_the_context_width_not_the_batch() -> None:
    """A new widest context width is a new window variant (its own compile, off the step); another
    batch size is not. The draw's variant follows the logits' width class (a keyed int) and whether
    rows fire, not the batch."""
    from dynlogits.kernels import watermark as kernels

    def window(rows: int, wide: int) -> Hashable:
        tokens = torch.zeros(8, 64, dtype=torch.int32)
        pos = torch.zeros(rows, dtype=torch.int32)
        return kernels.window_variant(tokens, torch.zeros(8, dtype=torch.int32), pos, None, None,
                                      torch.zeros(rows, dtype=torch.int64), torch.ones(rows, dtype=torch.bool),
                                      torch.zeros(8, 4, dtype=torch.int64), wide, True, 32)[0]

    def draw(rows: int, vocab: int, fire: bool) -> Hashable:
        index = torch.zeros(rows, dtype=torch.int64)
        return kernels.draw_variant(torch.zeros(rows, vocab), index, index, torch.ones(8, 1), torch.zeros(8, 4, dtype=torch.int64),
                                    torch.zeros(rows, 4, dtype=torch.int64), index if fire else None, True)[0]

    assert window(3, 4) == window(17, 4) != window(3, 5)
    assert draw(3, 1000, True) == draw(17, 1000, True) == draw(64, 1000, True)
    assert draw(3, 1000, True) != draw(3, 1024, True) and draw(3, 1000, True) != draw(3, 1000, False)
