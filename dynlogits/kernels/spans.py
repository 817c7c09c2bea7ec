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
* ``STRETCH`` (a scoped positional kind, ``scope.StretchScopeTables``): in the entry's phase
  (``OUT != 0``) the stretch's count ``c - ANCHOR`` (``force`` is not read);
* ``FLOOR`` (a scoped window-decided kind, ``scope.FloorScopeTables``): in the entry's phase the
  stretch's start ``ANCHOR``, else (and where a row may not be decided) ``NEVER`` instead of ``-1``.

With ``restart``, ``epoch``, ``scope`` and ``prompt_len`` (``[n, STATE]``, ``[n]``, ``[n, STATE]``,
``[n]``: a scoped automaton, ``stretch_spans.StretchSpans``) a restart stage runs first: each row's
stretch start ``s = max(scope[ANCHOR], prompt_len)``; where ``s != epoch`` the state becomes
``restart + s * scale``; ``epoch`` gets ``s``; and the decision is ``-1`` (whatever ``rule``) where
``scope[OUT] == 0`` (out of the entry's phase). One launch still (``restarted_advance_rows``).

A step's rows with drafts before them (speculative decoding) are followed per row by a second op,
``dynlogits::spans_drafts_`` (``drafts_reference``): each row's slot state advanced over the drafts
fed before it, whether it may be decided (no placeholder draft before it) and, by ``rule``, its
decision at count ``committed + drafts``, its tokens read from the matrix up to the committed ones
and from the fed drafts after; one launch on CUDA. Its restart stage (the same four arguments,
``restart`` and ``epoch`` per slot, ``scope`` per row, ``prompt_len`` per engine slot) restarts
each row's state at its own scope row's stretch before the drafts, writes nothing back, and
decides in the entry's phase only.

Nothing here imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .variants import jitted, launch_variant, launches_variant

__all__ = ["BIG", "BLOCK", "CLOSED", "DUE", "FLOOR", "FORCING", "GATE", "NEVER", "NO_RULE", "PAD", "PHRASE", "PLACEHOLDER", "RULES", "STATE", "STRETCH", "advance_reference", "decide_reference", "drafts_args", "drafts_case", "drafts_reference", "drafts_same", "force_case", "kernels", "launch", "launch_args", "launch_drafts", "launches", "probe_case", "restart_case", "restart_reference", "restart_same", "spans_advance_", "spans_drafts_", "variant"]

#: state columns and ``KEY``'s weight of a length (as ``dynlogits.processors.device_thinking``)
KEY, ANCHOR, SEL, OUT, STATE = 0, 1, 2, 3, 4
BIG = 1 << 32
#: the span start a decision reads for "no open span" (as ``device_thinking.CLOSED``)
CLOSED = -(1 << 40)
#: a right-aligned sequence's column before its first token, and a fed token no row takes for one
#: (as ``device_thinking``): no token id equals it
PAD = -(1 << 40)
#: a draft not yet replaced by its token (``dynlogits.processors.spans.PLACEHOLDER``)
PLACEHOLDER = -1
#: the decision rules (module doc)
NO_RULE, PHRASE, DUE, STRETCH, FLOOR = 0, 1, 2, 3, 4
RULES = (NO_RULE, PHRASE, DUE, STRETCH, FLOOR)
#: the rules that read ``force`` and ``force_len``
FORCING = (PHRASE, DUE)
#: ``FLOOR``'s decision for a row out of its phase: past every position (as ``device_thinking.NEVER``)
NEVER = 1 << 62
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


def _rule(state: torch.Tensor, count: torch.Tensor, force: torch.Tensor, length: torch.Tensor, rule: int,
          token_at: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each row fires by ``rule`` at ``count`` and the token it forces then (module doc);
    ``token_at(positions)``: the row's tokens at ``[rows, k]`` positions."""
    width = force.shape[1]
    span_len = count - state[:, ANCHOR]
    if rule == STRETCH:
        return state[:, OUT] != 0, span_len
    if rule == FLOOR:
        return state[:, OUT] != 0, state[:, ANCHOR]
    if rule == PHRASE:
        fire = (state[:, SEL] == 1) & (state[:, ANCHOR] != CLOSED) & (span_len < length)
        return fire, force.gather(1, span_len.clamp(0, width - 1)[:, None])[:, 0]
    fire = count >= state[:, OUT]
    progress = torch.zeros_like(count)
    for k in range(1, width):  # the last k tokens == force[:k]
        tail = token_at(count[:, None] - k + torch.arange(k, device=count.device))
        match = (tail.long() == force[:, :k]).all(1) & (k < length) & (k <= span_len)
        progress = torch.where(match, k, progress)
    return fire, force.gather(1, progress[:, None])[:, 0]


def decide_reference(state: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor, decided: torch.Tensor,
                     force: torch.Tensor, force_len: torch.Tensor, rule: int) -> None:
    """The eager reference of the decision (any device; module doc): the ops of the kinds'
    ``decide_state`` for one row per slot, no drafts."""
    if rule == NO_RULE:
        return
    n, max_len = tokens.shape
    rows = torch.arange(n, device=tokens.device)[:, None]
    fire, token = _rule(state, total_len.long(), force, force_len[:, 0], rule,
                        lambda at: tokens[rows, at.clamp(0, max_len - 1)])
    decided.copy_(torch.where(fire, token, NEVER if rule == FLOOR else -1))


def restart_reference(state: torch.Tensor, restart: torch.Tensor, epoch: torch.Tensor, scope: torch.Tensor,
                      prompt_len: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The eager reference of the restart stage (any device, ``state`` in place; module doc): each
    row's stretch start ``max(scope[:, ANCHOR], prompt_len)``, returned, and where it is not the
    row's ``epoch`` the row's ``restart`` state with the start added by ``scale``."""
    start = torch.maximum(scope[:, ANCHOR], prompt_len)
    torch.where((epoch != start)[:, None], torch.addcmul(restart, start[:, None], scale), state, out=state)
    return start


def _in_phase(decided: torch.Tensor, scope: torch.Tensor | None, rule: int) -> None:
    """With a restart stage and a rule: ``decided`` ``-1`` where the row's ``scope`` state is out of
    the entry's phase (``OUT == 0``)."""
    if scope is not None and rule != NO_RULE:
        decided.masked_fill_(scope[:, OUT] == 0, -1)


@fused_op("spans_advance_", launches=1, mutates_args=("state", "decided", "epoch"))
def spans_advance_(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                   scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
                   force_len: torch.Tensor, rule: int, restart: torch.Tensor | None = None,
                   epoch: torch.Tensor | None = None, scope: torch.Tensor | None = None,
                   prompt_len: torch.Tensor | None = None) -> None:
    """Follow ``rounds`` positions of every row of one table in place, then decide by ``rule``
    (module doc), after the restart stage where ``restart`` is given (``epoch`` then written).
    Every device but CUDA: the eager references; CUDA: one Triton launch (none for zero rows)."""
    if restart is not None:
        assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
        epoch.copy_(restart_reference(state, restart, epoch, scope, prompt_len, scale))
    advance_reference(state, consts, tokens, total_len, scale, width, rounds)
    decide_reference(state, tokens, total_len, decided, force, force_len, rule)
    _in_phase(decided, scope if restart is not None else None, rule)


@spans_advance_.cuda
def _spans_advance_cuda(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                        scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
                        force_len: torch.Tensor, rule: int, restart: torch.Tensor | None = None,
                        epoch: torch.Tensor | None = None, scope: torch.Tensor | None = None,
                        prompt_len: torch.Tensor | None = None) -> None:
    launch(state, consts, tokens, total_len, scale, width, rounds, decided, force, force_len, rule, restart, epoch,
           scope, prompt_len)


def launch(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
           scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
           force_len: torch.Tensor, rule: int, restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
           scope: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None) -> None:
    """The Triton kernel over ``state``'s rows (any device Triton runs on, its interpreter included)."""
    n = state.shape[0]
    if not launches(n, rounds, rule, restart):
        return
    assert state.dtype == torch.int64 and state.stride(1) == 1, "state: int64 rows"
    assert consts.dtype == torch.int64 and consts.stride(1) == 1, "consts: int64 rows"
    assert rule in RULES
    if rule != NO_RULE:
        assert decided.dtype == force.dtype == force_len.dtype == torch.int64, "decisions: int64"
        assert decided.stride(0) == 1 and force.stride(1) == 1, "decided, force: contiguous rows"
    if restart is not None:
        assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
        assert restart.dtype == epoch.dtype == scope.dtype == torch.int64 and restart.stride(1) == 1
        assert scope.stride(1) == 1 and epoch.stride(0) == 1, "restart, scope: int64 rows; epoch contiguous"
    name, args, constants = launch_args(state, consts, tokens, total_len, scale, width, rounds, decided, force, force_len,
                                        rule, restart, epoch, scope, prompt_len)
    getattr(kernels(), name)[((n + BLOCK - 1) // BLOCK,)](*args, **constants)


def launch_args(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                scale: torch.Tensor, width: int, rounds: int, decided: torch.Tensor, force: torch.Tensor,
                force_len: torch.Tensor, rule: int, restart: torch.Tensor | None = None,
                epoch: torch.Tensor | None = None, scope: torch.Tensor | None = None,
                prompt_len: torch.Tensor | None = None) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """``launch``'s kernel (``advance_rows``, or ``restarted_advance_rows`` with a restart), its
    positional arguments and constexprs for ``launch``'s arguments (the launch and its off-step
    compile, ``variant``, take the same)."""
    n = state.shape[0]
    args: tuple[Any, ...] = (state, state.stride(0), consts, consts.stride(0), tokens, tokens.stride(0),
                             tokens.stride(1), tokens.shape[1], total_len, scale, n, max(rounds, 0), decided, force,
                             force.stride(0), force.shape[1], force_len, force_len.stride(0))
    constants = {"WIDTH": width, "BLOCK": BLOCK, "BIG": BIG, "CLOSED": CLOSED, "NEVER": NEVER, "RULE": rule}
    if restart is None:
        return "advance_rows", args, constants
    assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
    return ("restarted_advance_rows", (*args, restart, restart.stride(0), epoch, scope, scope.stride(0), prompt_len),
            constants)


def launches(n: int, rounds: int, rule: int, restart: torch.Tensor | None) -> bool:
    """Whether ``launch`` launches for ``n`` rows, ``rounds``, ``rule`` and ``restart``."""
    return not (n == 0 or (rounds <= 0 and rule == NO_RULE and restart is None))


def drafts_reference(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                     scale: torch.Tensor, width: int, slots: torch.Tensor, member: torch.Tensor, input_ids: torch.Tensor,
                     local_pos: torch.Tensor, later: int, rows_state: torch.Tensor, valid: torch.Tensor,
                     decided: torch.Tensor, force: torch.Tensor, force_len: torch.Tensor, rule: int,
                     restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
                     scope: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None) -> None:
    """The eager reference of ``spans_drafts_`` (any device; ``DeviceThinking.decide``'s ops with
    drafts): ``state``, ``consts``, ``force``, ``force_len`` per slot (indexed by ``slots``, a row's
    slot), ``tokens``/``total_len`` per engine slot (``slots`` clamped to them), ``input_ids`` the
    step's fed tokens (empty: none), ``local_pos`` each row's drafts before it, ``later`` the most
    drafts a row may have; writes ``rows_state`` ``[rows, STATE]``, ``valid`` and, by ``rule``,
    ``decided`` (``-1``: none) per row. With ``restart`` (per slot, with ``epoch``; ``scope`` per
    row, ``prompt_len`` per engine slot) each row's state is first restarted (``restart_reference``,
    nothing written back) and decided in the entry's phase only."""
    n, max_len = tokens.shape
    r = slots.shape[0]
    device = tokens.device
    clamped = slots.clamp(max=n - 1)
    committed = total_len[clamped].long()
    drafts = local_pos.long()
    tail = tokens[clamped[:, None], committed[:, None] + torch.arange(-width, 0, device=device)]
    steps = torch.arange(later + 1, device=device)[None, 1:]
    first = torch.arange(r, device=device) - drafts  # the row fed the last committed token
    fed = torch.full((r, later), PAD, dtype=torch.long, device=device)  # matches nothing
    if input_ids.numel() and later:
        fed = input_ids.long()[(first[:, None] + steps).clamp(0, len(input_ids) - 1)]
    seen = torch.cat([tail.long(), fed], 1)
    before = steps <= drafts[:, None]  # which of the drafts precede the row
    valid.copy_(member & ~((fed == PLACEHOLDER) & before).any(1))
    state_of = state[slots]
    if restart is not None:
        assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
        restart_reference(state_of, restart[slots], epoch[slots], scope, prompt_len[clamped], scale)
    view = consts[slots, : 2 * (width + STATE)].view(r, 2, width + STATE)
    for j in range(1, later + 1):
        position = committed + j
        now = view.gather(1, state_of[:, SEL, None, None].expand(-1, 1, width + STATE))[:, 0]
        matches = (seen[:, j : j + width] == now[:, :width]).sum(1)
        hit = (torch.add(position, matches, alpha=BIG) >= state_of[:, KEY]) & before[:, j - 1]
        torch.where(hit[:, None], torch.addcmul(now[:, width:], position[:, None], scale), state_of, out=state_of)
    rows_state.copy_(state_of)
    if rule == NO_RULE:
        return
    count = committed + drafts

    def token_at(at: torch.Tensor) -> torch.Tensor:
        from_matrix = tokens[clamped[:, None], at.clamp(0, max_len - 1)].long()
        if not input_ids.numel():
            return from_matrix
        fed_at = input_ids.long()[(first[:, None] + at - committed[:, None] + 1).clamp(0, len(input_ids) - 1)]
        return torch.where(at < committed[:, None], from_matrix, fed_at)

    fire, token = _rule(state_of, count, force[slots], force_len[slots, 0], rule, token_at)
    decided.copy_(torch.where(valid & fire, token, NEVER if rule == FLOOR else -1))
    _in_phase(decided, scope if restart is not None else None, rule)


@fused_op("spans_drafts_", launches=1, mutates_args=("rows_state", "valid", "decided"))
def spans_drafts_(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                  scale: torch.Tensor, width: int, slots: torch.Tensor, member: torch.Tensor, input_ids: torch.Tensor,
                  local_pos: torch.Tensor, later: int, rows_state: torch.Tensor, valid: torch.Tensor,
                  decided: torch.Tensor, force: torch.Tensor, force_len: torch.Tensor, rule: int,
                  restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
                  scope: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None) -> None:
    """A step's rows with drafts: each row's state over the drafts before it, whether it may be
    decided and its decision by ``rule`` (module doc, ``drafts_reference``). Every device but CUDA:
    the eager reference; CUDA: one Triton launch (none for zero rows)."""
    drafts_reference(state, consts, tokens, total_len, scale, width, slots, member, input_ids, local_pos, later,
                     rows_state, valid, decided, force, force_len, rule, restart, epoch, scope, prompt_len)


@spans_drafts_.cuda
def _spans_drafts_cuda(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                       scale: torch.Tensor, width: int, slots: torch.Tensor, member: torch.Tensor, input_ids: torch.Tensor,
                       local_pos: torch.Tensor, later: int, rows_state: torch.Tensor, valid: torch.Tensor,
                       decided: torch.Tensor, force: torch.Tensor, force_len: torch.Tensor, rule: int,
                       restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
                       scope: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None) -> None:
    launch_drafts(state, consts, tokens, total_len, scale, width, slots, member, input_ids, local_pos, later,
                  rows_state, valid, decided, force, force_len, rule, restart, epoch, scope, prompt_len)


def launch_drafts(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                  scale: torch.Tensor, width: int, slots: torch.Tensor, member: torch.Tensor, input_ids: torch.Tensor,
                  local_pos: torch.Tensor, later: int, rows_state: torch.Tensor, valid: torch.Tensor,
                  decided: torch.Tensor, force: torch.Tensor, force_len: torch.Tensor, rule: int,
                  restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
                  scope: torch.Tensor | None = None, prompt_len: torch.Tensor | None = None) -> None:
    """``spans_drafts_``'s Triton kernel over the rows (any device Triton runs on, its interpreter
    included)."""
    r = slots.shape[0]
    if r == 0:
        return
    assert state.dtype == consts.dtype == rows_state.dtype == torch.int64 and state.stride(1) == 1
    assert consts.stride(1) == 1 and rows_state.stride(1) == 1 and rule in RULES
    assert valid.dtype == member.dtype == torch.bool, "valid, member: bool"
    if restart is not None:
        assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
        assert restart.dtype == epoch.dtype == scope.dtype == torch.int64 and restart.stride(1) == 1
        assert scope.stride(1) == 1 and epoch.stride(0) == 1, "restart, scope: int64 rows; epoch contiguous"
    name, args, constants = drafts_args(state, consts, tokens, total_len, scale, width, slots, member, input_ids,
                                        local_pos, later, rows_state, valid, decided, force, force_len, rule, restart,
                                        epoch, scope, prompt_len)
    getattr(kernels(), name)[((r + BLOCK - 1) // BLOCK,)](*args, **constants)


def drafts_args(state: torch.Tensor, consts: torch.Tensor, tokens: torch.Tensor, total_len: torch.Tensor,
                scale: torch.Tensor, width: int, slots: torch.Tensor, member: torch.Tensor, input_ids: torch.Tensor,
                local_pos: torch.Tensor, later: int, rows_state: torch.Tensor, valid: torch.Tensor,
                decided: torch.Tensor, force: torch.Tensor, force_len: torch.Tensor, rule: int,
                restart: torch.Tensor | None = None, epoch: torch.Tensor | None = None,
                scope: torch.Tensor | None = None,
                prompt_len: torch.Tensor | None = None) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """``launch_drafts``' kernel (``drafts_rows``, or ``restarted_drafts_rows`` with a restart), its
    positional arguments and constexprs (the launch and its off-step compile,
    ``variant``, take the same)."""
    fed = input_ids if input_ids.numel() else local_pos  # not read without fed tokens
    args: tuple[Any, ...] = (state, state.stride(0), consts, consts.stride(0), tokens, tokens.stride(0),
                             tokens.stride(1), tokens.shape[0], tokens.shape[1], total_len, scale, slots, member, fed,
                             max(input_ids.numel(), 1), local_pos, slots.shape[0], later, rows_state,
                             rows_state.stride(0), valid, decided, force, force.stride(0), force.shape[1], force_len,
                             force_len.stride(0))
    constants = {"WIDTH": width, "BLOCK": BLOCK, "BIG": BIG, "CLOSED": CLOSED, "NEVER": NEVER, "PAD": PAD,
                 "PLACEHOLDER": PLACEHOLDER, "RULE": rule, "HAS_FED": bool(input_ids.numel())}
    if restart is None:
        return "drafts_rows", args, constants
    assert epoch is not None and scope is not None and prompt_len is not None, "a restart reads all four"
    return ("restarted_drafts_rows", (*args, restart, restart.stride(0), epoch, scope, scope.stride(0), prompt_len),
            constants)


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


def drafts_case(seed: int, n: int = 40, width: int = 3, later: int = 2, vocab: int = 4,
                fed: bool = True) -> tuple[Any, ...]:
    """Random host arguments of ``spans_drafts_`` but ``width``, ``later`` and ``rule``: ``probe_case``'s
    and ``force_case``'s per-slot tables (the last slot past the token matrix's rows: clamped), then
    requests of 1 to ``1 + later`` rows in a random slot each (``slots``, ``member``, ``input_ids``:
    each request's last committed token, then its drafts, some placeholders; empty without ``fed``;
    ``local_pos``), and the outputs (``rows_state``, ``valid``, ``decided``)."""
    state, consts, tokens, total_len, scale = probe_case(seed, n=n, width=width, vocab=vocab)
    _, force, force_len = force_case(seed, n=n, width=width, vocab=vocab)
    g = torch.Generator().manual_seed(20_000 + seed)
    slots, local, ids = [], [], []
    for _ in range(n // 2):
        slot, rows = int(torch.randint(0, n, (1,), generator=g)), int(torch.randint(1, later + 2, (1,), generator=g))
        slots += [slot] * rows
        local += list(range(rows))
        ids += torch.randint(-1, vocab, (rows,), generator=g).tolist()
    r = len(slots)
    member = torch.rand(r, generator=g) < 0.9
    input_ids = torch.tensor(ids, dtype=torch.int32) if fed else torch.empty(0, dtype=torch.int32)
    outputs = (torch.zeros((r, STATE), dtype=torch.long), torch.zeros(r, dtype=torch.bool), torch.full((r,), -7))
    return (state, consts, tokens[: n - 1], total_len[: n - 1], scale, torch.tensor(slots), member, input_ids,
            torch.tensor(local), force, force_len, *outputs)


def drafts_same(device: torch.device, seed: int, width: int, later: int, rule: int, fed: bool = True,
                restart: bool = False) -> bool:
    """``launch_drafts`` against ``drafts_reference`` on ``device`` for one ``drafts_case``, exactly
    (``restart``: with the restart stage, ``restart_case``'s per-slot rows and scope rows per row)."""
    (state, consts, tokens, total_len, scale, slots, member, input_ids, local, force, force_len, rows_state, valid,
     decided) = (t.to(device) for t in drafts_case(seed, width=width, later=later, fed=fed))
    stage: tuple[torch.Tensor | None, ...] = (None, None, None, None)
    if restart:
        restarts, epoch, scope, prompt_len = (t.to(device) for t in restart_case(seed, n=state.shape[0]))
        stage = (restarts, epoch, scope[slots.clamp(max=state.shape[0] - 1)].contiguous(), prompt_len[: tokens.shape[0]])
    got = (rows_state.clone(), valid.clone(), decided.clone())
    want = (rows_state.clone(), valid.clone(), decided.clone())
    launch_drafts(state, consts, tokens, total_len, scale, width, slots, member, input_ids, local, later, *got, force,
                  force_len, rule, *stage)
    drafts_reference(state, consts, tokens, total_len, scale, width, slots, member, input_ids, local, later, *want,
                     force, force_len, rule, *stage)
    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def restart_case(seed: int, n: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random host arguments of the restart stage (``restart``, ``epoch``, ``scope``, ``prompt_len``)
    for ``n`` rows: restart rows as ``SpanTables.resumed_state`` writes them (looking for the start
    sequence, small thresholds), scope states in and out of the entry's phase, and epochs that are
    the row's stretch start about half the time."""
    g = torch.Generator().manual_seed(30_000 + seed)
    restart = torch.stack((BIG * torch.randint(1, 4, (n,), generator=g) + torch.randint(1, 4, (n,), generator=g),
                           torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long),
                           torch.randint(0, 3, (n,), generator=g)), 1)
    scope = torch.stack((torch.randint(0, 30, (n,), generator=g), torch.randint(-4, 20, (n,), generator=g),
                         torch.randint(0, 2, (n,), generator=g), torch.randint(0, 2, (n,), generator=g)), 1)
    prompt_len = torch.randint(0, 6, (n,), generator=g, dtype=torch.int32)
    start = torch.maximum(scope[:, ANCHOR], prompt_len)
    epoch = torch.where(torch.rand(n, generator=g) < 0.5, start, torch.randint(0, 20, (n,), generator=g))
    return restart, epoch, scope, prompt_len


def restart_same(device: torch.device, seed: int, width: int, rounds: int, rule: int, n: int = 40) -> bool:
    """``launch`` with the restart stage against the references on ``device`` for one ``probe_case``
    and ``restart_case``, exactly (state, decisions, epochs)."""
    state, consts, tokens, total_len, scale = (t.to(device) for t in probe_case(seed, n=n, width=width))
    decided, force, force_len = (t.to(device) for t in force_case(seed, n=n, width=1 + seed % 3))
    restart, epoch, scope, prompt_len = (t.to(device) for t in restart_case(seed, n=n))
    fused, eager = state.clone(), state.clone()
    fused_decided, eager_decided = decided.clone(), decided.clone()
    fused_epoch, eager_epoch = epoch.clone(), epoch.clone()
    launch(fused, consts, tokens, total_len, scale, width, rounds, fused_decided, force, force_len, rule, restart,
           fused_epoch, scope, prompt_len)
    eager_epoch.copy_(restart_reference(eager, restart, eager_epoch, scope, prompt_len, scale))
    advance_reference(eager, consts, tokens, total_len, scale, width, rounds)
    decide_reference(eager, tokens, total_len, eager_decided, force, force_len, rule)
    _in_phase(eager_decided, scope, rule)
    return (torch.equal(fused, eager) and torch.equal(fused_decided, eager_decided)
            and torch.equal(fused_epoch, eager_epoch))


def _probe(device: torch.device) -> bool:
    """The kernel against the eager references on ``device``, exactly (one and several rounds, each
    rule)."""
    same = []
    for seed, rounds, rule in ((1, 1, NO_RULE), (2, 4, PHRASE), (3, 2, DUE), (5, 2, STRETCH), (6, 3, FLOOR)):
        state, consts, tokens, total_len, scale = (t.to(device) for t in probe_case(seed))
        decided, force, force_len = (t.to(device) for t in force_case(seed))
        fused, eager = state.clone(), state.clone()
        fused_decided, eager_decided = decided.clone(), decided.clone()
        launch(fused, consts, tokens, total_len, scale, 3, rounds, fused_decided, force, force_len, rule)
        advance_reference(eager, consts, tokens, total_len, scale, 3, rounds)
        decide_reference(eager, tokens, total_len, eager_decided, force, force_len, rule)
        same.append(torch.equal(fused, eager) and not torch.equal(eager, state)
                    and torch.equal(fused_decided, eager_decided))
    same += [drafts_same(device, 4, 3, 2, rule) for rule in RULES]
    same += [restart_same(device, 7, 3, 2, rule) and drafts_same(device, 8, 3, 2, rule, restart=True)
             for rule in (PHRASE, DUE)]
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("span following", lambda device: _probe(device))


def variant(advances: Sequence[tuple[Any, ...]] = (),
            drafts: Sequence[tuple[Any, ...]] = ()) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of the span ops one gated call makes: ``spans_advance_`` with each of
    ``advances`` (its arguments; one that launches nothing left out) then ``spans_drafts_`` with each
    of ``drafts``, each launch's kernel and arguments from ``launch_args`` and
    ``drafts_args`` (as the launches take them)."""
    pairs = []
    for args in advances:
        state, rounds, rule, restart = args[0], args[6], args[10], args[11] if len(args) > 11 else None
        if launches(state.shape[0], rounds, rule, restart):
            name, launched, constexprs = launch_args(*args)
            pairs.append(launch_variant(f"spans.{name}", jitted(kernels, name), state.device, launched, constexprs))
    for args in drafts:
        if args[6].shape[0]:  # the rows' slots: none, no launch
            name, launched, constexprs = drafts_args(*args)
            pairs.append(launch_variant(f"spans.{name}", jitted(kernels, name), args[0].device, launched, constexprs))
    return launches_variant(pairs)
