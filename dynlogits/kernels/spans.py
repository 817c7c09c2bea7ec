"""One table's span following over a step's rounds as one fused op (``dynlogits::spans_advance_``):
what ``DeviceThinking.step`` does per ``SpanTables`` (one window read and one
``SpanTables.advance`` per round), then, where the table's kind decides by a ``rule``, each slot's
decision at its last committed position, in one launch on CUDA (a Triton kernel, ``_spans_triton``).

Arguments: ``state`` ``[n, STATE]`` int64 (contiguous rows, updated in place), ``consts`` ``[n, >= 2 *
(width + STATE)]`` int64 (the table's ``consts`` rows: per state the looked-for sequence
right-aligned in ``width`` columns, then the next state's base), ``tokens`` ``[n, max_len]`` (the
engine's matrix, any integer dtype), ``total_len`` ``[n]`` (the last committed position of each
row), ``scale`` ``[STATE]`` int64. Rounds ``back = rounds - 1 .. 0`` follow position ``total_len -
back``: its ``width`` tokens ending there (a negative column reads from the row's end, as torch
indexing; a catch-up round clamps at ``-max_len``), ``matches`` = how many equal the current state's
sequence, a transition iff ``BIG * matches + position >= state[KEY]``, which writes ``base + position
* scale``.

Then ``decided`` ``[n]`` int64 gets each row's forced token (``-1``: none) at count ``c =
total_len`` from the state, ``force`` ``[n, F]`` int64 (a sequence per row, left-aligned) and
``force_len`` ``[n, >= 1]`` (its length in column 0), by ``rule`` (``NO_RULE``: ``decided`` is not
written):

* ``PHRASE`` (``trigger``): an open span (``SEL == 1``, ``ANCHOR != CLOSED``) ``k = c - ANCHOR``
  tokens long forces ``force[clamp(k, 0, F - 1)]`` while ``k < force_len``;
* ``DUE`` (``thinking_budget``): from ``c >= OUT`` on, ``force[p]``, ``p`` the largest ``k < F``
  with ``k < force_len``, ``k <= c - ANCHOR`` and the row's last ``k`` tokens (``tokens[c - k ..
  c - 1]``, columns clamped into the row) equal to ``force[:k]`` (else 0).

Nothing here imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from typing import Any

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

__all__ = ["BIG", "BLOCK", "CLOSED", "DUE", "GATE", "NO_RULE", "PHRASE", "RULES", "STATE", "advance_reference",
           "decide_reference", "force_case", "kernels", "launch", "probe_case", "spans_advance_"]

#: state columns and ``KEY``'s weight of a length (as ``dynlogits.processors.device_thinking``)
KEY, ANCHOR, SEL, OUT, STATE = 0, 1, 2, 3, 4
BIG = 1 << 32
#: the span start a decision reads for "no open span" (as ``device_thinking.CLOSED``)
CLOSED = -(1 << 40)
#: the decision rules (module doc)
NO_RULE, PHRASE, DUE = 0, 1, 2
RULES = (NO_RULE, PHRASE, DUE)
#: rows per program (a power of two)
BLOCK = 64


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _spans_triton

    return _spans_triton


def advance_reference(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                      scale: torch.Tensor, width: int, rounds: int) -> None:
    """The eager reference of the rounds (any device, in place): per round the window read of
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


def decide_reference(state: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor, decided: torch.Tensor,
                     force: torch.Tensor, force_len: torch.Tensor, rule: int) -> None:
    """The eager reference of the decision (any device; module doc): the ops of the kinds'
    ``decide_state`` for one row per slot, no drafts."""
    if rule == NO_RULE:
        return
    count = total_len.long()
    length = force_len[:, 0]
    width = force.shape[1]
    span_len = count - state[:, ANCHOR]
    if rule == PHRASE:
        fire = (state[:, SEL] == 1) & (state[:, ANCHOR] != CLOSED) & (span_len < length)
        token = force.gather(1, span_len.clamp(0, width - 1)[:, None])[:, 0]
    else:
        fire = count >= state[:, OUT]
        n, max_len = tokens.shape
        rows = torch.arange(n, device=tokens.device)[:, None]
        progress = torch.zeros_like(count)
        for k in range(1, width):  # the last k tokens == force[:k]
            tail = tokens[rows, (count[:, None] - k + torch.arange(k, device=tokens.device)).clamp(0, max_len - 1)]
            match = (tail.long() == force[:, :k]).all(1) & (k < length) & (k <= span_len)
            progress = torch.where(match, k, progress)
        token = force.gather(1, progress[:, None])[:, 0]
    decided.copy_(torch.where(fire, token, -1))


@fused_op("spans_advance_", launches=1, mutates_args=("state", "decided"))
def spans_advance_(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                   scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
                   force_len: torch.Tensor, rule: int) -> None:
    """Follow ``rounds`` positions of every row of one table in place, then decide by ``rule``
    (module doc). Every device but CUDA: the eager references; CUDA: one Triton launch (none for
    zero rows)."""
    advance_reference(state, consts, tokens, total_len, scale, width, rounds)
    decide_reference(state, tokens, total_len, decided, force, force_len, rule)


@spans_advance_.cuda
def _spans_advance_cuda(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                        scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
                        force_len: torch.Tensor, rule: int) -> None:
    launch(state, consts, tokens, total_len, scale, width, rounds, decided, force, force_len, rule)


def launch(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
           scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
           force_len: torch.Tensor, rule: int) -> None:
    """The Triton kernel over ``state``'s rows (any device Triton runs on, its interpreter included)."""
    n = state.shape[0]
    if n == 0 or (rounds <= 0 and rule == NO_RULE):
        return
    assert state.dtype == torch.int64 and state.stride(1) == 1, "state: int64 rows"
    assert consts.dtype == torch.int64 and consts.stride(1) == 1, "consts: int64 rows"
    assert rule in RULES
    if rule != NO_RULE:
        assert decided.dtype == force.dtype == force_len.dtype == torch.int64, "decisions: int64"
        assert decided.stride(0) == 1 and force.stride(1) == 1, "decided, force: contiguous rows"
    k = kernels()
    k.advance_rows[((n + BLOCK - 1) // BLOCK,)](
        state, state.stride(0), consts, consts.stride(0), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1],
        total_len, scale, n, max(rounds, 0), decided, force, force.stride(0), force.shape[1], force_len,
        force_len.stride(0), WIDTH=width, BLOCK=BLOCK, BIG=BIG, CLOSED=CLOSED, RULE=rule)


def probe_case(seed: int, n: int = 40, max_len: int = 24, width: int = 3, vocab: int = 4) -> tuple[torch.Tensor, ...]:
    """Random host arguments of ``spans_advance_``'s rounds but ``width`` and ``rounds`` (``state``,
    ``consts``, ``tokens``, ``total_len``, ``scale``): right-aligned sequences of 1 to ``width``
    tokens, keys at small thresholds, either state."""
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


def force_case(seed: int, n: int = 40, width: int = 3, vocab: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random host decision arguments of ``spans_advance_`` (``decided``, ``force``, ``force_len``):
    sequences of 1 to ``width`` tokens of the same small vocabulary as ``probe_case``'s tokens,
    padded by repeating their last one (as ``SlotTable``)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    length = torch.randint(1, width + 1, (n, 1), generator=g)
    force = torch.randint(0, vocab, (n, width), generator=g)
    force = force.gather(1, torch.minimum(torch.arange(width)[None, :], length - 1))
    return torch.full((n,), -7, dtype=torch.long), force, length


def _probe(device: torch.device) -> bool:
    """The kernel against the eager references on ``device``, exactly (one and several rounds, each
    rule)."""
    same = []
    for seed, rounds, rule in ((1, 1, NO_RULE), (2, 4, PHRASE), (3, 2, DUE)):
        state, consts, tokens, total_len, scale = (t.to(device) for t in probe_case(seed))
        decided, force, force_len = (t.to(device) for t in force_case(seed))
        fused, eager = state.clone(), state.clone()
        fused_decided, eager_decided = decided.clone(), decided.clone()
        launch(fused, consts, tokens, total_len, scale, 3, rounds, fused_decided, force, force_len, rule)
        advance_reference(eager, consts, tokens, total_len, scale, 3, rounds)
        decide_reference(eager, tokens, total_len, eager_decided, force, force_len, rule)
        same.append(torch.equal(fused, eager) and not torch.equal(eager, state)
                    and torch.equal(fused_decided, eager_decided))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("span following", lambda device: _probe(device))
