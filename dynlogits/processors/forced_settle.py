"""``forced_sequence``'s settle as one fused op (``dynlogits::forced_settle_``): on CUDA two
Triton launches (``dynlogits.kernels.forced``) where the eager path queues five (``index_select``,
``isneginf``, ``where``, ``index_fill_`` twice), once ``fused_ready`` (probed once per device
against the eager reference; in the CUDA model always). The CPU keeps the group's own host paths
(``ForcedSequenceGroup._settled_on_host``, else the eager ops): the op's CPU implementation is the
eager reference, run by the CUDA model and the tests."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from dynlogits.kernels import forced as forced_kernels
from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .slots import NEG_INF

__all__ = ["fused_ready", "pick_probe_case", "pick_settle_", "probe_case", "reset_fused", "run_pick_settle",
           "run_settle", "settle_"]

T = TypeVar("T")


@fused_op("forced_settle_", launches=2, mutates_args=("logits", "chosen", "dead"))
def settle_(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
            can_stop: torch.Tensor | None, chosen: torch.Tensor, dead: torch.Tensor) -> None:
    """Member row ``rows[i]`` of ``logits`` (contiguous ``[batch, vocab]``) forced: its forced logit
    (flat index ``picked[0, i]``) ``-inf`` goes in ``dead[i]``; ``chosen[p, i]`` is ``if_dead[p, i]``
    where it is (plane 0 only where ``can_stop[i]``, when given) else ``picked[p, i]``; the row is
    then ``-inf`` but at flat index ``chosen[0, i]``, which gets ``0.0``, or ``-inf`` where the row is
    dead and cannot stop. ``picked``, ``if_dead``, ``chosen``: ``[planes, n]`` int64; a NaN forced
    logit is not ``-inf``. Exactly ``ForcedSequenceGroup._settle``'s eager writes."""
    flat = logits.view(-1)
    torch.isneginf(flat.index_select(0, picked[0]), out=dead)
    if can_stop is None:
        torch.where(dead, if_dead, picked, out=chosen)
        logits.index_fill_(0, rows, NEG_INF)
        flat.index_fill_(0, chosen[0], 0.0)
        return
    swap = dead.expand(picked.shape).clone()
    swap[0].logical_and_(can_stop)
    torch.where(swap, if_dead, picked, out=chosen)
    value = torch.where(dead & ~can_stop, NEG_INF, 0.0).to(logits.dtype)
    logits.index_fill_(0, rows, NEG_INF)
    flat.index_copy_(0, chosen[0], value)


@settle_.cuda
def _settle_cuda(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
                 can_stop: torch.Tensor | None, chosen: torch.Tensor, dead: torch.Tensor) -> None:
    from dynlogits.kernels import forced as kernels

    kernels.settle_(logits, rows, picked, if_dead, can_stop, chosen, dead)


@fused_op("forced_pick_settle_", launches=2, mutates_args=("logits", "pick", "chosen", "dead"))
def pick_settle_(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                 values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                 chosen: torch.Tensor, dead: torch.Tensor) -> None:
    """``settle_`` after the pick of ``ForcedSequenceGroup._pick``: member row ``i``'s column is how
    many of its ``bounds`` (``[n, width]``, ascending, ``values``' dtype) are at most its value
    (``values[i]``, or ``values[rows[i]]`` unless ``identity``); ``pick`` (``[6, n]``) gets
    ``table[:, i, column]``, whose planes ``0..2`` are ``settle_``'s ``picked`` and ``3..5`` its
    ``if_dead``."""
    n = rows.shape[0]
    member = values if identity else values[rows]
    column = torch.searchsorted(bounds, member.view(n, 1), right=True)
    pick.copy_(table.gather(2, column.view(1, n, 1).expand(6, n, 1)).view(6, n))
    settle_.eager(logits, rows, pick[:3], pick[3:], can_stop, chosen, dead)


@pick_settle_.cuda
def _pick_settle_cuda(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                      values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                      chosen: torch.Tensor, dead: torch.Tensor) -> None:
    from dynlogits.kernels import forced as kernels

    kernels.pick_settle_(logits, rows, table, bounds, values, identity, can_stop, pick, chosen, dead)


def fused_ready(device: torch.device) -> bool:
    """Whether ``settle_`` runs on ``device`` (``dynlogits.kernels.probe.FusedGate``): never on the
    CPU, always in the CUDA model, on CUDA once ``_probe`` passed (random steps through the kernels
    and the eager reference on that device, compared exactly); else one warning and the eager ops
    for good."""
    return _GATE.ready(device)


def run_settle(device: torch.device, args: tuple[Any, ...]) -> None:
    """``settle_(*args)`` through the gate, else its eager reference; on CUDA named by its variant
    (``kernels.forced.settle_variant``: both launches' planes, stops, dtypes), so a variant not
    compiled yet compiles off the step and the eager ops answer until it lands."""
    _GATE.run_named(device, lambda: settle_(*args), lambda: settle_.eager(*args), forced_kernels.settle_variant, *args)


def run_pick_settle(device: torch.device, args: tuple[Any, ...]) -> None:
    """``pick_settle_(*args)`` as ``run_settle`` runs ``settle_`` (``kernels.forced.pick_settle_variant``:
    identity, stops, the bounds' and values' dtypes)."""
    _GATE.run_named(device, lambda: pick_settle_(*args), lambda: pick_settle_.eager(*args),
                    forced_kernels.pick_settle_variant, *args)


def probe_case(seed: int, device: torch.device, *, rows: int = 12, vocab: int = 300, planes: int = 3,
               stops: bool = True) -> tuple[torch.Tensor, ...]:
    """A random settle on ``device``: ``(logits, rows, picked, if_dead, can_stop)`` with some rows'
    forced logits ``-inf`` (and a NaN or an infinity elsewhere), member rows a random subset of a
    larger batch in random order, forced and stop columns sometimes equal; ``can_stop`` ``None``
    unless ``stops``."""
    g = torch.Generator().manual_seed(seed)
    batch = rows + int(torch.randint(0, 4, (1,), generator=g))
    logits = torch.randn(batch, vocab, generator=g)
    member = torch.randperm(batch, generator=g)[:rows]
    forced = torch.randint(0, vocab, (rows,), generator=g)
    stop = torch.where(torch.rand(rows, generator=g) < 0.2, forced, torch.randint(0, vocab, (rows,), generator=g))
    masked = torch.rand(rows, generator=g) < 0.4
    logits[member[masked], forced[masked]] = float("-inf")
    odd = torch.rand(rows, generator=g) < 0.1
    logits[member[odd], forced[odd]] = float("nan")
    logits[member[:1], stop[:1]] = float("inf")
    base = member * vocab
    extra = torch.randint(0, 1000, (planes - 1, rows), generator=g)
    picked = torch.cat([(base + forced)[None], extra])
    if_dead = torch.cat([(base + stop)[None], extra + 7])
    can_stop = (torch.rand(rows, generator=g) < 0.7) if stops else None
    made = (logits, member, picked, if_dead, can_stop)
    return tuple(None if t is None else t.to(device) for t in made)  # type: ignore[misc]


def pick_probe_case(seed: int, device: torch.device, *, rows: int = 12, vocab: int = 300, width: int = 40,
                    stops: bool = True, identity: bool = False, dtype: torch.dtype = torch.int64) -> tuple[Any, ...]:
    """A random ``pick_settle_`` on ``device``: ``(logits, rows, table, bounds, values, identity,
    can_stop)``; each row's bounds ascending, ``NEVER`` past its length, values below, among and
    past them; the table's forced and stop columns drawn as in ``probe_case``."""
    g = torch.Generator().manual_seed(seed)
    logits, member, _, _, can_stop = probe_case(seed, torch.device("cpu"), rows=rows, vocab=vocab, stops=stops)
    base = (member * vocab)[:, None]
    choices = torch.randint(0, vocab, (rows, 3), generator=g)  # each row's table names three ids
    forced = choices.gather(1, torch.randint(0, 3, (rows, width + 1), generator=g))
    stop = torch.randint(0, vocab, (rows, 1), generator=g).expand(rows, width + 1)
    masked = torch.rand(rows, 3, generator=g) < 0.4
    logits[member[:, None].expand(rows, 3)[masked], choices[masked]] = float("-inf")
    extra = torch.randint(0, 1000, (4, rows, width + 1), generator=g)
    table = torch.stack([base + forced, extra[0], extra[1], base + stop, extra[2], extra[3]])
    bounds = torch.sort(torch.randint(0, 3 * width, (rows, width), generator=g), dim=1).values
    length = torch.randint(0, width + 1, (rows, 1), generator=g)
    bounds = bounds.masked_fill(torch.arange(width) >= length, (1 << 31) - 1)
    values = torch.randint(-2, 3 * width + 2, (rows if identity else logits.shape[0],), generator=g)
    made = (logits, member, table, bounds.to(dtype), values.to(dtype))
    return (*(t.to(device) for t in made), identity, None if can_stop is None else can_stop.to(device))


def _probe(device: torch.device) -> bool:
    """``settle_``'s kernels against the eager reference on ``device``, exactly (see ``fused_ready``)."""
    same = []
    for seed, planes, stops in ((1, 2, False), (2, 3, True), (3, 2, True), (4, 3, False)):
        logits, rows, picked, if_dead, can_stop = probe_case(20261128 + seed, device, planes=planes, stops=stops)
        outs: list[tuple[torch.Tensor, ...]] = []
        for impl in (_settle_cuda, settle_.eager):
            out: tuple[torch.Tensor, ...] = (logits.clone(), torch.empty_like(picked), torch.empty_like(rows, dtype=torch.bool))
            impl(out[0], rows, picked, if_dead, can_stop, out[1], out[2])
            outs.append(out)
        same.append(all(torch.equal(a, b) for a, b in zip(*outs)))
    for seed, identity, stops in ((5, True, False), (6, False, True)):
        logits, rows, table, bounds, values, identity, can_stop = pick_probe_case(
            20261128 + seed, device, identity=identity, stops=stops, dtype=torch.int32 if stops else torch.int64)
        outs = []
        for impl in (_pick_settle_cuda, pick_settle_.eager):
            out = (logits.clone(), torch.empty((6, rows.shape[0]), dtype=torch.long, device=device),
                   torch.empty((3, rows.shape[0]), dtype=torch.long, device=device),
                   torch.empty_like(rows, dtype=torch.bool))
            impl(out[0], rows, table, bounds, values, identity, can_stop, *out[1:])
            outs.append(out)
        same.append(all(torch.equal(a, b) for a, b in zip(*outs)))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
_GATE = FusedGate("forced_sequence", lambda device: _probe(device))


def reset_fused() -> None:
    """Forget every device's probe (tests)."""
    _GATE.reset()
