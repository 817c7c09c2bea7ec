"""A GPU check of ``dynlogits::spans_advance_`` (``dynlogits.kernels.spans``): its Triton kernel on
CUDA against the eager references on the same device, exactly, over random tables (1 to ``width``
token sequences, either state, small thresholds; 1 to 6 rounds, rows past one block, int32 and int64
token matrices; each decision rule, ``PHRASE`` and ``DUE`` with 1 to 3 token forced sequences, a
scoped entry's ``STRETCH`` and ``FLOOR``; and with the restart stage a scoped automaton runs first:
epochs that are and are not the stretch's start, scopes in and out of phase), and ``spans_drafts_``'s
against its reference (rows with 0 to 3 drafts, with and without fed tokens, each rule, with and
without the restart stage), and the span kinds' fused forcing
``dynlogits::decided_settle_`` (``dynlogits.kernels.thinking_force``) against its reference (float32,
bfloat16, float16 logits; with and without positions; and in its sequence form, scoped or not:
``forced_sequence``'s counts). ``python -m dynlogits.testing.cuda.spans_check``: prints the differing cases and
exits nonzero on any (2 without a CUDA device). ``run`` and ``cpu_check`` are what
``python -m dynlogits.testing.cuda.check`` calls (on a GPU, and in Triton's CPU interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import torch

from dynlogits.kernels import thinking_force
from dynlogits.kernels.spans import (
    RULES,
    advance_reference,
    decide_reference,
    drafts_same,
    force_case,
    launch,
    probe_case,
    restart_same,
)

__all__ = ["cpu_check", "main", "run"]


def main(device: torch.device | None = None) -> int:
    """0 when every case matches, 1 on a difference, 2 without CUDA (``device``: another one Triton
    runs on, e.g. the CPU in Triton's interpreter)."""
    if device is None:
        if not torch.cuda.is_available():
            print("spans_check: no CUDA device")
            return 2
        device = torch.device("cuda")
    bad: list[tuple[int, int, int, int]] = []
    cases = 0
    for seed in range(60):
        for width in (1, 2, 3):
            n = 300 if seed % 7 == 0 else 40
            state, consts, tokens, total_len, scale = (t.to(device) for t in probe_case(seed, n=n, width=width))
            if seed % 2:
                tokens = tokens.long()
            rounds, rule = 1 + seed % 6, RULES[(seed + width) % len(RULES)]
            decided, force, force_len = (t.to(device) for t in force_case(seed, n=n, width=1 + seed % 3))
            fused, eager = state.clone(), state.clone()
            fused_decided, eager_decided = decided.clone(), decided.clone()
            launch(fused, consts, tokens, total_len, scale, width, rounds, fused_decided, force, force_len, rule)
            advance_reference(eager, consts, tokens, total_len, scale, width, rounds)
            decide_reference(eager, tokens, total_len, eager_decided, force, force_len, rule)
            cases += 1
            if not (torch.equal(fused, eager) and torch.equal(fused_decided, eager_decided)):
                bad.append((seed, width, rounds, rule))
    for seed in range(30):
        for rule in RULES:
            cases += 1
            if not drafts_same(device, seed, 1 + seed % 3, seed % 4, rule, fed=seed % 5 != 0):
                bad.append((-1, seed, 1 + seed % 3, rule))  # -1: a drafts case
            cases += 1
            if not restart_same(device, seed, 1 + seed % 3, seed % 5, rule, n=300 if seed % 7 == 0 else 40):
                bad.append((-4, seed, 1 + seed % 3, rule))  # -4: a restart-and-advance case
            cases += 1
            if not drafts_same(device, seed, 1 + seed % 3, seed % 4, rule, fed=seed % 5 != 0, restart=True):
                bad.append((-5, seed, 1 + seed % 3, rule))  # -5: a restarted drafts case
    for seed in range(20):
        for code, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
            cases += 1
            if not thinking_force.same(device, seed, dtype, positions=seed % 3 != 0, drafts=seed % 2 == 0):
                bad.append((-2, seed, code, 0))  # -2: a forcing case
            cases += 1
            if not thinking_force.same(device, seed, dtype, drafts=seed % 2 == 0, sequence=True, scoped=seed % 3 != 1):
                bad.append((-3, seed, code, 0))  # -3: a forcing case in the sequence form
    print(f"spans_check: {cases} cases, {len(bad)} differ {bad[:10]}")
    return 1 if bad else 0


def run(device: torch.device) -> tuple[bool, dict[str, Any]]:
    """``main`` on a CUDA ``device``: whether every case matched, and its exit status."""
    status = main(device)
    return status == 0, {"status": status}


def cpu_check() -> bool:
    """``main`` on the CPU with the kernel in Triton's interpreter (a subprocess: ``TRITON_INTERPRET=1``
    is set before Triton is imported)."""
    code = "import sys, torch; from dynlogits.testing.cuda.spans_check import main; sys.exit(main(torch.device('cpu')))"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                          check=False).returncode == 0


if __name__ == "__main__":
    sys.exit(main())
