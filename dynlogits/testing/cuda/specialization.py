"""Which compiled variants the fused ops' Triton kernels would need: the cache key each launch gets,
recorded on the CPU.

A jitted kernel's compiled variant is chosen per launch by a key (triton/runtime/jit.py,
``create_function_from_signature`` and ``JITFunction.run``): every ``tl.constexpr``'s value, and for
every other argument what ``native_specialize_impl`` makes of it under the parameter's
``do_not_specialize``/``do_not_specialize_on_alignment`` flags: an int's type (``i32``, ``i64`` from
``2**31``) and whether it equals 1 (then a constexpr) or is divisible by 16 (``'D'``); a tensor's
dtype and whether its address is 16-byte aligned. A key not seen before compiles a new variant in
the launching call: on an engine, inside a step.

``record()`` patches Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is imported)
so that each launch appends a ``Launch`` (its key, computed by Triton's own binder) and, unless
``execute``, skips the kernel's body; ``variants`` groups them by what may select a variant (the
kernel, the constexprs, the tensors' dtypes, the launch options) and ``extra`` lists the groups
that needed more than one (an int's or an offset's class changed). ``sweep()`` drives every kind's
fused ops over batches, widths, entry counts, phrase lengths and offset views.
``python -m dynlogits.testing.cuda.specialization`` prints each kernel's variants and the extra
ones (exit 1 when any)."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BATCHES", "DEPLOYMENT_KEYED", "EXECUTED", "Launch", "extra", "main", "record", "specialized", "sweep", "variants"]

#: the sweep's batch sizes: 1 (an int equal to 1), 16 and 64 (divisible by 16), 2 and 17 (neither)
BATCHES = (1, 2, 16, 17, 64)
#: arguments keyed on purpose (deployment constants whose variant ``warm(device, vocab)`` compiles at
#: load; see ``dynlogits.kernels._watermark_triton``): their classes select a group like a constexpr
DEPLOYMENT_KEYED: dict[str, frozenset[str]] = {
    "_watermark_triton.draw_blocks": frozenset({"logits_ptr", "logits_stride", "vocab"}),
    "_watermark_triton.draw_reduce": frozenset({"logits_ptr", "logits_stride", "vocab"}),
}
#: the kernels whose bodies ``sweep`` needs run (their outputs index the op's next step)
EXECUTED = frozenset({"_dry_triton.decide_rows"})


@dataclass(frozen=True)
class Launch:
    """One kernel launch's cache key: ``group`` (what may select a variant: constexpr values, tensor
    dtypes, launch options, ``DEPLOYMENT_KEYED`` arguments' classes) and ``classes`` (each other
    argument's class: must not vary in a group)."""

    kernel: str
    group: tuple[tuple[str, str], ...]
    classes: tuple[tuple[str, str], ...]


def _binder(function: Any) -> tuple[Callable[..., Any], frozenset[str]]:
    """Triton's own argument binder for an interpreted kernel, with its decorator's flags, and the
    names of its constexpr parameters."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    kwargs = function.kwargs
    jitted = JITFunction(function.fn, do_not_specialize=kwargs.get("do_not_specialize"),
                         do_not_specialize_on_alignment=kwargs.get("do_not_specialize_on_alignment"))
    constexprs = frozenset(p.name for p in jitted.params if p.is_constexpr)
    return create_function_from_signature(jitted.signature, jitted.params, BaseBackend), constexprs


def _launch(function: Any, binder: tuple[Callable[..., Any], frozenset[str]], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Launch:
    bound, specialization, options = binder[0](*args, **kwargs)
    group: list[tuple[str, str]] = []
    classes: list[tuple[str, str]] = []
    keyed = DEPLOYMENT_KEYED.get(f"{function.fn.__module__}.{function.fn.__name__}".removeprefix("dynlogits.kernels."),
                                 frozenset())
    for (name, value), (kind, spec) in zip(bound.items(), specialization, strict=True):
        if name in binder[1]:
            group.append((name, repr(spec)))
        elif name in keyed:
            group.append((name, f"{kind}:{spec!r}"))
        elif isinstance(value, torch.Tensor):
            group.append((name, str(kind)))
            classes.append((name, repr(spec)))
        else:
            classes.append((name, f"{kind}:{spec!r}"))
    group.extend((k, repr(v)) for k, v in sorted(options.items()))
    return Launch(f"{function.fn.__module__}.{function.fn.__name__}", tuple(group), tuple(classes))


@contextmanager
def record(*, execute: bool | Collection[str] = EXECUTED) -> Iterator[list[Launch]]:
    """Every interpreted kernel launch in the block, appended to the yielded list; the kernels' bodies
    run with ``execute`` (all, or those named ``module.kernel`` as in ``EXECUTED``), the others are
    skipped (their outputs left as they were). Requires ``TRITON_INTERPRET=1`` before Triton was
    imported."""
    from triton import knobs
    from triton.runtime.interpreter import InterpretedFunction

    if not knobs.runtime.interpret:
        raise RuntimeError("record() needs TRITON_INTERPRET=1 set before Triton is imported")
    launches: list[Launch] = []
    binders: dict[int, tuple[Callable[..., Any], frozenset[str]]] = {}
    original = InterpretedFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        binder = binders.get(id(self))
        if binder is None:
            binder = binders[id(self)] = _binder(self)
        launch = _launch(self, binder, args, kwargs)
        launches.append(launch)
        runs = execute if isinstance(execute, bool) else launch.kernel.removeprefix("dynlogits.kernels.") in execute
        return original(self, *args, grid=grid, warmup=warmup, **kwargs) if runs else None

    InterpretedFunction.run = run
    try:
        yield launches
    finally:
        InterpretedFunction.run = original


def variants(launches: Sequence[Launch]) -> dict[tuple[str, tuple[tuple[str, str], ...]], set[tuple[tuple[str, str], ...]]]:
    """Per (kernel, group): the distinct argument classes seen (each one a compiled variant)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    for launch in launches:
        found[(launch.kernel, launch.group)].add(launch.classes)
    return dict(found)


def extra(launches: Sequence[Launch]) -> dict[str, dict[str, set[str]]]:
    """Per kernel, the arguments whose class varied within one group (each a variant compiled because
    an int or an address changed), with the classes seen; empty when none varied."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for (kernel, _), seen in variants(launches).items():
        if len(seen) < 2:
            continue
        for name in dict(next(iter(seen))):
            values = {dict(classes)[name] for classes in seen}
            if len(values) > 1:
                out[kernel][name] |= values
    return {k: dict(v) for k, v in out.items()}


def specialized(launches: Sequence[Launch], keep: Callable[[str], bool]) -> dict[str, dict[str, set[str]]]:
    """Per kernel, the arguments Triton specialized on their value or address in some launch (an int
    equal to 1 or divisible by 16, an aligned address) but for those ``keep`` names: each one a
    variant an engine's other value would compile, whether or not the sweep varied it. An int Triton
    left alone has the class ``None``; a pointer left alone reads ``''`` (as an unaligned one does,
    so a pointer is flagged where some launch's address was aligned and keyed ``'D'``)."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for launch in launches:
        for name, cls in launch.classes:
            scalar = ":" in cls  # an int's "type:class"; a tensor's class alone ('' unaligned or unflagged)
            if not keep(name) and (not cls.endswith("None") if scalar else cls == "'D'"):
                out[launch.kernel][name].add(cls)
    return {k: dict(v) for k, v in out.items()}


def _offset_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` as a view one row into a larger buffer (an engine's logits slice: the address moves
    by one row's bytes, which need not be a multiple of 16)."""
    buffer = torch.empty((logits.shape[0] + 1, logits.shape[1]), dtype=logits.dtype, device=logits.device)
    view = buffer[1:]
    view.copy_(logits)
    return view


def sweep(batches: Sequence[int] = BATCHES) -> None:
    """Every kind's fused ops over ``batches`` and sizes in each class (equal to 1, divisible by 16,
    neither), two vocabularies, and logits given as offset row views (launches to be recorded)."""
    import contextlib
    import io

    from dynlogits.kernels import banned_phrases, dead_rows, multiple_choice, no_repeat_ngram, spans
    from dynlogits.processors import dry_device, no_repeat_ngram_device

    from . import (
        banned_phrases_check,
        dead_rows_check,
        dry_check,
        forced_check,
        multiple_choice_check,
        no_repeat_ngram_check,
        spans_check,
        watermark_check,
    )

    cpu = torch.device("cpu")
    with contextlib.redirect_stdout(io.StringIO()):  # the checks' lines: not judged here
        for vocab in (1003, 1024):
            no_repeat_ngram_check.bits(cpu, vocab, batches)
            dead_rows_check.bits(cpu, vocab, batches)
            forced_check.bits(cpu, vocab, batches)
            multiple_choice_check.bits(cpu, vocab, batches)
            banned_phrases_check.bits(cpu, vocab, batches)
            watermark_check.fused_bits(cpu, vocab, batches)
        watermark_check.window_bits(cpu, batches)
        for width in (33, 64):
            dry_check.bits(cpu, batches, vocab=1003, width=width, fused_step=dry_device._fused_lower_cuda)
        spans_check.main(cpu)
        for n in batches:
            for rounds in (1, 2, 16, 17):
                state, consts, tokens, total_len, scale = spans.probe_case(n, n=n)
                decided, force, force_len = spans.force_case(n, n=n)
                spans.launch(state, consts, tokens[:, 1:], total_len, scale, 3, rounds, decided, force, force_len,
                             spans.PHRASE)
        for rows in (1, 17):  # window widths and witness widths in each class; a token matrix at a column offset
            window, layout, logits, _ = no_repeat_ngram_device.probe_case(rows, cpu, rows=rows, slots=rows + 1, length=80)
            size = layout.source.size
            for width in (size, 16, 17, 64):
                no_repeat_ngram.ban_(_offset_rows(logits), window.tokens[:, 1:], window.pos, layout.slot_of_row,
                                     layout.source.params, None, None, None, max(width, size), size)
            for width in (1, 16, 17):
                case = dead_rows.probe_case(rows, cpu, listed=True, rows=rows, width=width)
                dead_rows.apply(dead_rows.launch, case, logits=_offset_rows(case[0]))
        for entries, width in ((1, 1), (7, 5), (16, 12), (17, 40)):
            for rows in (1, 17):
                case = banned_phrases.probe_case(entries + width, rows=rows, entries=entries, width=width)
                banned_phrases.launch(*case._replace(logits=_offset_rows(case.logits)))
                choice = multiple_choice.probe_case(entries + width, rows=rows, entries=entries, width=width)
                multiple_choice.launch(*choice._replace(logits=_offset_rows(choice.logits)))


def main(argv: Sequence[str] | None = None) -> int:
    """Print each kernel's variants over ``sweep`` and the arguments that varied; 1 when any did."""
    del argv
    with record() as launches:
        sweep()
    for (kernel, group), seen in sorted(variants(launches).items()):
        print(f"{kernel} {dict(group)}: {len(seen)} variant(s)")
    varied = extra(launches)
    for kernel, args in sorted(varied.items()):
        for name, values in sorted(args.items()):
            print(f"EXTRA {kernel}.{name}: {sorted(values)}")
    print("result:", "FAILED" if varied else "ok")
    return 1 if varied else 0


if __name__ == "__main__":
    sys.exit(main())
