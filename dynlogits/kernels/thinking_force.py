"""The span-decided kinds' forcing (``trigger``, ``thinking_budget``: ``device_thinking.SettledForcing``)
as one fused op, ``dynlogits::decided_settle_``, where no later group can mask the rows and the
step reports flags per row: what ``slots.force_device_decisions`` and then
``Failures.record_dead`` write, in one launch on CUDA (a Triton kernel, ``_thinking_force_triton``).

Arguments: ``logits`` ``[rows, vocab]`` (rows contiguous), ``decisions`` ``[rows]`` int64 (the token
a row forces, ``-1``: none), ``member`` ``[rows]`` bool, ``slot_of_row`` ``[rows]`` int64, ``stops``
``[slots]`` int64 (each slot's stop token, ``-1``: none), ``positions`` ``[rows]`` (each row's
generated count; empty: 0), ``sentinel`` (the slot that flags nothing), ``real`` ``[rows]`` bool
(under speculative decoding whether the row follows its request's committed tokens, no draft before
it; empty: every row). A row fires where it is a
member and decides a token ``d``; it is dead where ``logits[r, d]`` was ``-inf``. A firing row
becomes ``-inf`` but at ``d``: ``0.0`` if alive, else ``-inf``, and a dead row with a stop token
gets ``0.0`` there (written after ``d``). ``flags`` ``[2, rows]`` int64 gets each row's slot where
it is dead and real (else ``sentinel``: a dead row after a draft only stops, the draft may be
rejected, as ``Failures.record_dead`` does) and its position; ``dead`` ``[rows]`` bool whether it is
dead.

With a ``sequence`` ``[slots, W]`` int64 (``forced_sequence``'s tokens then EOS, per slot; empty:
``decisions`` are the tokens) and its ``length`` ``[slots, >= 1]`` int64 (column 0), ``decisions``
are each row's generated counts ``c`` instead (``ForcedSequenceGroup.settle_at_counts``): the row
forces ``sequence[slot, clamp(c, 0, length)]`` (with ``scoped``, ``-1`` where ``c < 0``: a scoped
row out of its phase) and its position is ``min(c, length)`` (``positions`` is not read).

One launch: every column of a row is written by one program only (the row's first block writes
``d`` and the stop token after reading ``logits[r, d]``; the others fill their columns but those
two), so no program reads a value another writes. Nothing here imports Triton until a CUDA tensor
arrives; no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .variants import launch_variant

__all__ = ["BLOCK", "GATE", "NO_SEQUENCE", "decided_settle_", "kernels", "launch", "launch_args", "probe_case", "run_gated", "sequence_case", "settle_reference", "variant"]

T = TypeVar("T")

#: columns per program (a power of two)
BLOCK = 1024


@functools.cache
def kernels() -> Any:
    """The jitted kernel's module (Triton imported here, once)."""
    from . import _thinking_force_triton

    return _thinking_force_triton


def settle_reference(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
                     stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor,
                     dead: torch.Tensor, real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                     scoped: bool) -> None:
    """The eager reference (any device, in place): ``force_device_decisions``' ops (``force_gathered``),
    then ``Failures.record_dead``'s for these rows, with per-row flags (module doc); with a
    ``sequence``, first ``settle_at_counts``' token and position of each row."""
    if sequence.numel():
        counts = decisions
        span = length[slot_of_row, 0]
        decisions = sequence[slot_of_row, counts.clamp(min=0).minimum(span)]
        if scoped:
            decisions = torch.where(counts >= 0, decisions, -1)
        positions = counts.minimum(span)
    where = member & (decisions >= 0)
    index = decisions.clamp(min=0)[:, None]
    kept = logits.gather(1, index)
    masked = torch.isneginf(kept)
    logits.masked_fill_(where[:, None], float("-inf"))
    logits.scatter_(1, index, kept.masked_fill_(where[:, None] & ~masked, 0.0))
    torch.logical_and(masked[:, 0], where, out=dead)
    stop = stops[slot_of_row]
    at_stop = stop.clamp(min=0)[:, None]
    logits.scatter_(1, at_stop, logits.gather(1, at_stop).masked_fill_((dead & (stop >= 0))[:, None], 0.0))
    flags[0].copy_(torch.where(dead & real if real.numel() else dead, slot_of_row, sentinel))
    if positions.numel():
        flags[1].copy_(positions)
    else:
        flags[1].zero_()


@fused_op("decided_settle_", launches=1, mutates_args=("logits", "flags", "dead"))
def decided_settle_(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
                    stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor,
                    dead: torch.Tensor, real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                    scoped: bool) -> None:
    """Force the decided rows and settle the dead ones (module doc). Every device but CUDA: the
    eager reference; CUDA: one Triton launch (none for zero rows)."""
    settle_reference(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real, sequence,
                     length, scoped)


@decided_settle_.cuda
def _decided_settle_cuda(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor,
                         slot_of_row: torch.Tensor, stops: torch.Tensor, positions: torch.Tensor, sentinel: int,
                         flags: torch.Tensor, dead: torch.Tensor, real: torch.Tensor, sequence: torch.Tensor,
                         length: torch.Tensor, scoped: bool) -> None:
    launch(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead, real, sequence, length,
           scoped)


def launch(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
           stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor, dead: torch.Tensor,
           real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor, scoped: bool) -> None:
    """The Triton kernel over every row and block of columns (any device Triton runs on, its
    interpreter included)."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    assert logits.stride(1) == 1 and flags.dtype == torch.int64 and flags.stride(1) == 1, "contiguous rows"
    assert member.dtype == dead.dtype == real.dtype == torch.bool, "member, dead, real: bool"
    if sequence.numel():
        assert sequence.dtype == length.dtype == torch.int64 and sequence.stride(1) == 1, "sequence: int64 rows"
    args, constexprs = launch_args(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags, dead,
                                   real, sequence, length, scoped)
    kernels().settle_rows[(rows, (vocab + BLOCK - 1) // BLOCK)](*args, **constexprs)


def launch_args(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
                stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor, dead: torch.Tensor,
                real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                scoped: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``settle_rows``' positional arguments and constexprs for ``launch``'s arguments (the launch
    and its off-step compile, ``variant``, take the same)."""
    has_positions, has_real, has_sequence = bool(positions.numel()), bool(real.numel()), bool(sequence.numel())
    args = (logits, logits.stride(0), decisions, member, slot_of_row, stops, positions if has_positions else decisions,
            flags, flags.stride(0), dead, real if has_real else member, logits.shape[1], sentinel,
            sequence if has_sequence else decisions, sequence.stride(0) if has_sequence else 0,
            length if has_sequence else decisions, length.stride(0) if has_sequence else 0)
    return args, {"HAS_POSITIONS": has_positions, "HAS_REAL": has_real, "HAS_SEQUENCE": has_sequence,
                  "SCOPED": bool(scoped), "BLOCK": BLOCK}


def probe_case(seed: int, rows: int = 24, vocab: int = 2500, slots: int = 10,
               dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """Random host arguments of ``decided_settle_``: logits with ``-inf`` columns (some at the
    decided tokens, some at the stop tokens), some NaN, decisions (``-1`` in some rows), members,
    slots (a few without a stop token, some stop tokens equal to the decided ones), positions."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g).to(dtype)
    decisions = torch.randint(-1, 6, (rows,), generator=g)
    stops = torch.randint(-1, 6, (slots,), generator=g)
    logits[torch.rand(rows, vocab, generator=g) < 0.3] = float("-inf")
    logits[torch.rand(rows, vocab, generator=g) < 0.01] = float("nan")
    member = torch.rand(rows, generator=g) < 0.85
    slot_of_row = torch.randint(0, slots, (rows,), generator=g)
    positions = torch.randint(0, 50, (rows,), generator=g)
    outputs = (torch.full((2, rows), -7, dtype=torch.long), torch.zeros(rows, dtype=torch.bool))
    real = torch.rand(rows, generator=g) < 0.6
    return logits, decisions, member, slot_of_row, stops, positions, slots, *outputs, real


#: ``decided_settle_``'s ``sequence`` and ``length`` where ``decisions`` are the tokens
NO_SEQUENCE = torch.empty((0, 1), dtype=torch.long)


def sequence_case(seed: int, rows: int = 24, slots: int = 10, width: int = 5) -> tuple[torch.Tensor, ...]:
    """Random host ``sequence``, ``length`` and counts (``decisions``) of ``decided_settle_``'s
    sequence form: sequences of 0 to ``width - 1`` tokens of ``probe_case``'s small ids then an EOS
    repeated (as ``ForcedSequenceGroup.sequence``), counts from -2 (a row in prefill, or out of its
    phase) to past the longest sequence."""
    g = torch.Generator().manual_seed(30_000 + seed)
    length = torch.randint(0, width, (slots, 1), generator=g)
    sequence = torch.randint(0, 6, (slots, width), generator=g)
    sequence = sequence.gather(1, torch.minimum(torch.arange(width)[None, :], length))
    return sequence, length, torch.randint(-2, width + 2, (rows,), generator=g)


def same(device: torch.device, seed: int, dtype: torch.dtype = torch.float32, positions: bool = True,
         drafts: bool = False, sequence: bool = False, scoped: bool = False) -> bool:
    """The kernel against the reference on ``device`` for one ``probe_case``, exactly (NaN equal);
    ``drafts``: with the case's real-row mask (else an empty one: every row real); ``sequence``: in
    the sequence form (``sequence_case``'s counts as ``decisions``; ``scoped`` as given)."""
    logits, decisions, member, slot_of_row, stops, pos, sentinel, flags, dead, real = probe_case(seed, dtype=dtype)
    seq, length = NO_SEQUENCE, NO_SEQUENCE
    if sequence:
        seq, length, decisions = sequence_case(seed, rows=len(decisions), slots=sentinel)
    decisions, member, slot_of_row, stops, seq, length = (t.to(device) for t in (decisions, member, slot_of_row, stops,
                                                                                  seq, length))
    pos = (pos if positions else torch.empty(0, dtype=torch.long)).to(device)
    real = (real if drafts else torch.empty(0, dtype=torch.bool)).to(device)
    got = (logits.to(device), flags.to(device), dead.to(device))
    want = (got[0].clone(), got[1].clone(), got[2].clone())
    launch(got[0], decisions, member, slot_of_row, stops, pos, sentinel, got[1], got[2], real, seq, length, scoped)
    settle_reference(want[0], decisions, member, slot_of_row, stops, pos, sentinel, want[1], want[2], real, seq, length,
                     scoped)
    return (torch.equal(got[0].isnan(), want[0].isnan()) and torch.equal(got[0].nan_to_num(), want[0].nan_to_num())
            and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]))


def _probe(device: torch.device) -> bool:
    """The kernel against the reference on ``device`` (float32 and bfloat16, with and without
    positions, with and without a real-row mask, and in the sequence form, scoped or not)."""
    return (all(same(device, seed, dtype, positions=seed % 2 == 0, drafts=drafts)
                for seed, dtype in ((1, torch.float32), (2, torch.bfloat16)) for drafts in (False, True))
            and all(same(device, 3, torch.float32, drafts=scoped, sequence=True, scoped=scoped)
                    for scoped in (False, True)))


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("span-decided forcing", lambda device: _probe(device))


def variant(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
            stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor, dead: torch.Tensor,
            real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
            scoped: bool) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``launch`` for these arguments."""
    args, constexprs = launch_args(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags,
                                           dead, real, sequence, length, scoped)
    return launch_variant("thinking_force", lambda: kernels().settle_rows, logits.device, args, constexprs)


def run_gated(device: torch.device, args: tuple[Any, ...], fused: Callable[[], T], eager: Callable[[], T]) -> T:
    """``fused()`` (a step around ``decided_settle_(*args)``) through ``GATE``: on CUDA named by its
    launch's ``variant``, so a variant not compiled yet compiles off the step and ``eager()`` (the
    caller's path without the settle) answers until it lands."""
    return GATE.run_named(device, fused, eager, variant, *args)
