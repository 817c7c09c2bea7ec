"""Every fused kernel compiles only the variants its constexprs and dtypes select: over a sweep of
batch sizes (1, 2, 16, 17, 64), widths, entry counts, phrase lengths, vocabularies and offset views
(``dynlogits.testing.cuda.specialization.sweep``), no launch's cache key differs from another of the
same kernel, constexprs and dtypes because an int's class (equal to 1, divisible by 16, neither) or
a pointer's alignment changed. On CUDA each such difference is a compile inside an engine step.

The kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set in a subprocess before Triton
is imported); the keys are Triton's own (its binder, with each kernel's decorator flags)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: every kernel a fused op launches (the sweep must reach each one)
KERNELS = {
    "_banned_phrases_triton.ban_rows", "_dead_rows_triton.dead_rows", "_dry_triton.decide_rows",
    "_forced_triton.decide_rows", "_forced_triton.fill_rows", "_forced_triton.pick_decide_rows",
    "_multiple_choice_triton.keep_rows", "_no_repeat_ngram_triton.ban_rows", "_spans_triton.advance_rows",
    "_spans_triton.restarted_advance_rows", "_spans_triton.drafts_rows", "_spans_triton.restarted_drafts_rows",
    "_thinking_force_triton.settle_rows", "_watermark_triton.draw_blocks", "_watermark_triton.draw_reduce",
    "_watermark_triton.absorb_rows", "_watermark_triton.window_decide",
}

CHILD = """
import json
import re
from dynlogits.testing.cuda.specialization import extra, record, specialized, sweep, variants
with record() as launches:
    sweep()
found = variants(launches)
innermost = re.compile(r"(_s1|_stride1)$").search  # a contiguous row's stride: 1 everywhere
valued = specialized(launches, lambda name: bool(innermost(name)) or name == "table_s2")
print(json.dumps({
    "specialized": {k: {a: sorted(v) for a, v in args.items()} for k, args in valued.items()},
    "kernels": sorted({k.removeprefix("dynlogits.kernels.") for k, _ in found}),
    "groups": len(found),
    "extra": {k: {a: sorted(v) for a, v in args.items()} for k, args in extra(launches).items()},
}))
"""


@pytest.fixture(scope="module")
def swept() -> dict[str, object]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_sweep_launches_every_fused_kernel(swept: dict[str, object]) -> None:
    assert set(swept["kernels"]) == KERNELS  # type: ignore[arg-type]  # the sweep's JSON values are a union


def test_no_kernel_compiles_a_variant_because_an_int_or_an_address_changed(swept: dict[str, object]) -> None:
    assert swept["extra"] == {}, "\n".join(f"{kernel}.{arg}: {values}" for kernel, args in
                                           swept["extra"].items() for arg, values in args.items())  # type: ignore[union-attr]  # the sweep's JSON values are a union


def test_every_runtime_int_and_pointer_is_unspecialized(swept: dict[str, object]) -> None:
    """Beyond what the sweep varied: no int but a contiguous row's stride keys a variant on its value,
    no pointer on its address (an engine's other batch, window or offset view would compile one)."""
    assert swept["specialized"] == {}, "\n".join(f"{kernel}.{arg}: {values}" for kernel, args in
                                                 swept["specialized"].items() for arg, values in args.items())  # type: ignore[union-attr]  # the sweep's JSON values are a union
