"""One table's span following over a step's rounds as one fused op (``dynlogits::spans_advance_``):
what ``DeviceThinking.step`` does per ``SpanTables`` without drafts (one window read and one
``SpanTables.advance`` per round), in one launch on CUDA (a Triton kernel, ``_spans_triton``).

Arguments: ``state`` ``[n, STATE]`` int64 (contiguous rows, updated in place), ``consts`` ``[n, >= 2 *
(width + STATE)]`` int64 (the table's ``consts`` rows: per state the looked-for sequence
right-aligned in ``width`` columns, then the next state's base), ``tokens`` ``[n, max_len]`` (the
engine's matrix, any integer dtype), ``total_len`` ``[n]`` (the last committed position of each
row), ``scale`` ``[STATE]`` int64. Rounds ``back = rounds - 1 .. 0`` follow position ``total_len -
back``: its ``width`` tokens ending there (a negative column reads from the row's end, as torch
indexing; a catch-up round clamps at ``-max_len``), ``matches`` = how many equal the current state's
sequence, a transition iff ``BIG * matches + position >= state[KEY]``, which writes ``base + position
* scale``. Nothing here imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from typing import Any

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

__all__ = ["BIG", "BLOCK", "GATE", "STATE", "advance_reference", "kernels", "launch", "probe_case", "spans_advance_"]

#: state columns and ``KEY``'s weight of a length (as ``dynlogits.processors.device_thinking``)
KEY, SEL, STATE = 0, 2, 4
BIG = 1 << 32
#: rows per program (a power of two)
BLOCK = 64


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _spans_triton

    return _spans_triton


def advance_reference(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                      scale: torch.Tensor, width: int, rounds: int) -> None:
    """The eager reference (any device, in place): per round the window read of
    ``DeviceThinking._window`` and the ops of ``SpanTables.advance``."""
    n, max_len = tokens.shape
    rows = torch.arange(n, device=tokens.device)[:, None]
    view = consts[:, : 2 * (width + STATE)].reshape(n, 2, width + STATE)
    for back in range(rounds - 1, -1, -1):
        where = total_len[:, None] + torch.arange(-width - back, -back, device=tokens.device)
        if back:
            where = where.clamp(min=-max_len)
        window = tokens[rows, where]
        position = total_len - back if back else total_len
        now = view.gather(1, state[:, SEL, None, None].expand(-1, 1, width + STATE))[:, 0]
        matches = (window == now[:, :width]).sum(1)
        hit = torch.add(position, matches, alpha=BIG) >= state[:, KEY]
        torch.where(hit[:, None], torch.addcmul(now[:, width:], position[:, None], scale), state, out=state)


@fused_op("spans_advance_", launches=1, mutates_args=("state",))
def spans_advance_(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                   scale: torch.Tensor, width: int, rounds: int) -> None:
    """Follow ``rounds`` positions of every row of one table in place (module doc). Every device but
    CUDA: ``advance_reference``; CUDA: one Triton launch (none for zero rows)."""
    advance_reference(state, consts, tokens, total_len, scale, width, rounds)


@spans_advance_.cuda
def _spans_advance_cuda(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                        scale: torch.Tensor, width: int, rounds: int) -> None:
    launch(state, consts, tokens, total_len, scale, width, rounds)


def launch(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
           scale: torch.Tensor, width: int, rounds: int) -> None:
    """The Triton kernel over ``state``'s rows (any device Triton runs on, its interpreter included)."""
    n = state.shape[0]
    if n == 0 or rounds <= 0:
        return
    assert state.dtype == torch.int64 and state.stride(1) == 1, "state: int64 rows"
    assert consts.dtype == torch.int64 and consts.stride(1) == 1, "consts: int64 rows"
    k = kernels()
    k.advance_rows[((n + BLOCK - 1) // BLOCK,)](
        state, state.stride(0), consts, consts.stride(0), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1],
        total_len, scale, n, rounds, WIDTH=width, BLOCK=BLOCK, BIG=BIG)


def probe_case(seed: int, n: int = 40, max_len: int = 24, width: int = 3, vocab: int = 4) -> tuple[torch.Tensor, ...]:
    """Random host arguments of ``spans_advance_`` but ``width`` and ``rounds`` (``state``, ``consts``,
    ``tokens``, ``total_len``, ``scale``): right-aligned sequences of 1 to ``width`` tokens, keys at
    small thresholds, either state."""
    g = torch.Generator().manual_seed(seed)
    consts = torch.randint(0, vocab, (n, 2, width + STATE), generator=g)
    lengths = torch.randint(1, width + 1, (n, 2), generator=g)
    pad = torch.arange(width)[None, None, :] < (width - lengths)[:, :, None]
    consts[:, :, :width][pad] = -(1 << 40)
    consts[:, :, width] = BIG * lengths + torch.randint(0, 3, (n, 2), generator=g)
    consts[:, :, width + 2] = torch.tensor([1, 0])
    sel = torch.randint(0, 2, (n,), generator=g)
    state = torch.stack((BIG * lengths.gather(1, sel[:, None])[:, 0] + torch.randint(0, 8, (n,), generator=g),
                         torch.randint(-3, 5, (n,), generator=g), sel, torch.randint(-3, 4, (n,), generator=g)), 1)
    tokens = torch.randint(0, vocab, (n, max_len), generator=g, dtype=torch.int32)
    total_len = torch.randint(1, max_len + 1, (n,), generator=g, dtype=torch.int32)
    return state, consts.reshape(n, -1), tokens, total_len, torch.tensor([1, 1, 0, 1])


def _probe(device: torch.device) -> bool:
    """The kernel against ``advance_reference`` on ``device``, exactly (one and several rounds)."""
    same = []
    for seed, rounds in ((1, 1), (2, 4)):
        state, consts, tokens, total_len, scale = (t.to(device) for t in probe_case(seed))
        fused, eager = state.clone(), state.clone()
        launch(fused, consts, tokens, total_len, scale, 3, rounds)
        advance_reference(eager, consts, tokens, total_len, scale, 3, rounds)
        same.append(torch.equal(fused, eager) and not torch.equal(eager, state))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("span following", lambda device: _probe(device))
