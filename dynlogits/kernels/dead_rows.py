"""The restrictive groups' dead-row epilogue (``Failures.record_dead`` for one ``Dead``) as one fused
op, ``dynlogits::dead_rows_``: which rows have no token left (``evaluate_reference``: every id of the
row's witness ``-inf``), the stop token of each such row set to ``0.0`` where it has one, and the
row's slot flagged with its output position (``scatter_reduce_`` ``amax``). On CUDA one Triton
launch (``_dead_rows_triton``), once ``GATE`` probed it; elsewhere the eager reference
(``record_reference``: exactly the eager ops, which stay the fallback).

Arguments. Listed layout (``rows`` given): ``witness`` ``[n, w]`` flat indices into ``logits``,
``stop_index`` ``[n]`` flat indices, ``can_stop`` ``[n]`` bool or ``None`` (every row can stop).
Gathered layout (``rows`` ``None``): ``witness`` ``[rows, w]`` column ids, ``stops`` ``[slots]``
each slot's stop token (``-1``: none), ``where`` ``[rows]`` bool or ``None`` (the rows touched).
Both: ``slots`` each row's slot, ``positions`` its output position (``None``: 0), ``real_rows``
``[batch]`` bool or ``None`` (a row after drafts only stops: it is not flagged), ``flags``
``[slots]`` int64, max-reduced in place with the position where flagged, else ``-1``.

One launch, one program per row: program ``i`` reads row ``i``'s witness, then writes that row's
stop token and ``atomic_max``es its slot's flag. Every witness index and the stop index of row
``i`` lie in the logits row ``i`` stands for, and the rows are distinct (a member row appears once
in a layout), so no program reads what another writes; the flags are written only by atomics
(several rows, drafts, may share a slot), whose max is the same in any order. Nothing here
imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .variants import launch_variant

__all__ = ["BLOCK", "GATE", "apply", "dead_rows_", "evaluate_reference", "flag_reference", "kernels", "launch", "launch_args", "probe_case", "record_reference", "same", "variant"]

#: witness ids per iteration of a program (a power of two)
BLOCK = 128


@functools.cache
def kernels() -> Any:
    """The jitted kernel's module (Triton imported here, once)."""
    from . import _dead_rows_triton

    return _dead_rows_triton


def evaluate_reference(logits: torch.Tensor, witness: torch.Tensor, listed: bool,
                       where: torch.Tensor | None) -> torch.Tensor:
    """Per row, whether every id of its witness is ``-inf`` (a ``processors.slots.Dead``'s rows)."""
    if listed:
        n = witness.shape[0]
        return torch.isneginf(logits.view(-1).index_select(0, witness.reshape(-1)).view(n, -1)).all(1)
    dead = torch.isneginf(logits.gather(1, witness)).all(1)
    return dead if where is None else dead & where


def flag_reference(flags: torch.Tensor, slots: torch.Tensor, dead: torch.Tensor, rows: torch.Tensor | None,
                   positions: torch.Tensor | None, real_rows: torch.Tensor | None,
                   minus_one: torch.Tensor | int = -1) -> None:
    """Each dead row's slot max-reduced with its position (``0`` without ``positions``), a row after
    drafts (``real_rows`` false) left out; ``minus_one``: ``-1``, or a kept 0-dim int64 tensor of it
    on the device (no scalar made per call)."""
    flagged = dead if real_rows is None else dead & (real_rows if rows is None else real_rows[rows])
    position = positions if positions is not None else torch.zeros_like(slots)
    flags.scatter_reduce_(0, slots, torch.where(flagged, position, minus_one), reduce="amax")


def record_reference(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
                     positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
                     stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
                     flags: torch.Tensor, minus_one: torch.Tensor | int = -1) -> None:
    """The eager reference (any device, in place): the module doc's writes, as eager tensor ops
    (``minus_one``: ``flag_reference``'s)."""
    dead = evaluate_reference(logits, witness, rows is not None, where)
    if rows is not None:
        assert stop_index is not None
        flat = logits.view(-1)
        at_stop = flat.index_select(0, stop_index)
        stopping = dead if can_stop is None else dead & can_stop
        flat.index_copy_(0, stop_index, at_stop.masked_fill_(stopping, 0.0))
    else:
        assert stops is not None
        stop = stops[slots]
        index = stop.clamp(min=0)[:, None]
        at_stop = logits.gather(1, index)
        logits.scatter_(1, index, at_stop.masked_fill_((dead & (stop >= 0))[:, None], 0.0))
    flag_reference(flags, slots, dead, rows, positions, real_rows, minus_one)


@fused_op("dead_rows_", launches=1, mutates_args=("logits", "flags"))
def dead_rows_(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
               positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
               stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
               flags: torch.Tensor) -> None:
    """Settle and flag one ``Dead``'s rows (module doc). Every device but CUDA: the eager
    reference; CUDA: one Triton launch (none for zero rows)."""
    record_reference(logits, witness, rows, slots, positions, stop_index, can_stop, stops, where, real_rows, flags)


@dead_rows_.cuda
def _dead_rows_cuda(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
                    positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
                    stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
                    flags: torch.Tensor) -> None:
    launch(logits, witness, rows, slots, positions, stop_index, can_stop, stops, where, real_rows, flags)


def launch(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
           positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
           stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
           flags: torch.Tensor) -> None:
    """The Triton kernel, one program per row (any device Triton runs on, its interpreter included)."""
    n = witness.shape[0]
    if n == 0:
        return
    listed = rows is not None
    assert logits.stride(1) == 1 and flags.dtype == torch.int64 and flags.stride(0) == 1, "contiguous rows, flags"
    assert (stop_index if listed else stops) is not None, "a listed layout's stop_index, a gathered one's stops"
    args, constexprs = launch_args(logits, witness, rows, slots, positions, stop_index, can_stop, stops, where,
                                   real_rows, flags)
    kernels().dead_rows[(n,)](*args, **constexprs)


def launch_args(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
                positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
                stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
                flags: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``dead_rows``' positional arguments and constexprs for ``launch``'s arguments (the launch and
    its off-step compile, ``variant``, take the same)."""
    listed = rows is not None
    args = (logits, logits.stride(0), witness, witness.stride(0), witness.stride(1), witness.shape[1],
            rows if rows is not None else slots, slots, positions if positions is not None else slots,
            stop_index if listed else stops, can_stop if can_stop is not None else slots,
            where if where is not None else slots, real_rows if real_rows is not None else slots, flags)
    return args, {"LISTED": listed, "HAS_POSITIONS": positions is not None, "HAS_CAN_STOP": listed and can_stop is not None,
                  "HAS_WHERE": not listed and where is not None, "HAS_REAL": real_rows is not None, "BLOCK": BLOCK}


def probe_case(seed: int, device: torch.device, *, listed: bool, rows: int = 12, vocab: int = 300, width: int = 5,
               slots: int = 6, positions: bool = True, stops: bool = True, real: bool = False,
               dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    """Random arguments of ``dead_rows_`` on ``device``: ``(logits, witness, rows, slot_ids,
    positions, stop_index, can_stop, stops, where, real_rows, flags)``. Some rows' witnesses all
    ``-inf`` (dead), some with a NaN (not dead), stop tokens sometimes inside the witness, rows
    sharing slots, listed rows a random subset of a larger batch in random order; ``can_stop``
    (listed) and ``where`` (gathered) ``None`` unless ``stops``; ``real_rows`` only with ``real``;
    flags mostly ``-1`` (none flagged), some above."""
    g = torch.Generator().manual_seed(seed)
    batch = rows + (int(torch.randint(0, 4, (1,), generator=g)) if listed else 0)
    logits = torch.randn(batch, vocab, generator=g).to(dtype)
    member = torch.randperm(batch, generator=g)[:rows] if listed else torch.arange(batch)
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    stop = torch.where(torch.rand(rows, generator=g) < 0.2, ids[:, 0], torch.randint(0, vocab, (rows,), generator=g))
    killed = torch.rand(rows, generator=g) < 0.5
    logits[member[killed][:, None].expand(-1, width), ids[killed]] = float("-inf")
    odd = torch.rand(rows, generator=g) < 0.1
    logits[member[odd], ids[odd, -1]] = float("nan")
    logits[member[:1], stop[:1]] = float("-inf")
    slot_of_row = torch.randint(0, slots, (rows,), generator=g)
    position = torch.randint(0, 50, (rows,), generator=g) if positions else None
    real_rows = torch.rand(batch, generator=g) < 0.7 if real else None
    flags = torch.where(torch.rand(slots, generator=g) < 0.7, -1, torch.randint(0, 30, (slots,), generator=g))
    if listed:
        base = member * vocab
        can_stop = (torch.rand(rows, generator=g) < 0.7) if stops else None
        made: tuple[Any, ...] = (logits, base[:, None] + ids, member, slot_of_row, position, base + stop, can_stop,
                                 None, None, real_rows, flags)
    else:
        slot_stops = torch.where(torch.rand(slots, generator=g) < 0.3, -1, torch.randint(0, vocab, (slots,), generator=g))
        where = (torch.rand(rows, generator=g) < 0.8) if stops else None
        made = (logits, ids, None, slot_of_row, position, None, None, slot_stops, where, real_rows, flags)
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in made)


def apply(impl: Callable[..., None], case: tuple[Any, ...], logits: torch.Tensor | None = None,
          flags: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``impl`` (``launch``, ``record_reference``, ``dead_rows_``) on a ``probe_case``, writing into
    ``logits`` and ``flags`` (default: fresh copies of the case's); the two."""
    logits = case[0].clone() if logits is None else logits
    flags = case[10].clone() if flags is None else flags
    impl(logits, case[1], case[2], case[3], case[4], case[5], case[6], case[7], case[8], case[9], flags)
    return logits, flags


def same(device: torch.device, case: tuple[Any, ...]) -> bool:
    """The kernel against the reference on ``device`` for one ``probe_case``, exactly (NaN equal)."""
    (got, got_flags), (want, want_flags) = apply(launch, case), apply(record_reference, case)
    return (torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
            and torch.equal(got_flags, want_flags))


def _probe(device: torch.device) -> bool:
    """The kernel against the reference on ``device``: both layouts, with and without positions,
    stop flags and drafts, float32 and bfloat16."""
    return all(same(device, probe_case(20261128 + seed, device, listed=listed, positions=seed % 2 == 0,
                                       stops=seed % 3 > 0, real=seed > 1, dtype=dtype))
               for seed, dtype in ((1, torch.float32), (2, torch.bfloat16), (3, torch.float32)) for listed in (True, False))


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("restrictive dead rows", lambda device: _probe(device))


def variant(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
            positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
            stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
            flags: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``launch`` for these arguments."""
    args, constexprs = launch_args(logits, witness, rows, slots, positions, stop_index, can_stop, stops, where,
                                           real_rows, flags)
    return launch_variant("dead_rows", lambda: kernels().dead_rows, logits.device, args, constexprs)
