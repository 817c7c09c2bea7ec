"""``banned_phrases``' Model Runner V2 step as one fused op (``dynlogits::banned_phrases_ban_``):
every row's last tokens read from the engine's token matrix (drafts from ``input_ids``), compared
with every entry of its slot, and the ban of each entry that matches written as ``-inf``: what
``processors.banned_phrases.BannedPhrasesGroup``'s eager device path (``decide_from_window``, then
``apply_device_decisions``) masks, in one launch on CUDA (a Triton kernel, ``_banned_phrases_triton``).

Arguments (the group's tables and the step's ``TokenWindow``): ``logits`` ``[rows, V]``; ``tokens``
``[engine_slots, max_len]`` (any integer dtype), ``prompt_len`` per engine slot, ``pos``,
``slot_of_row`` (int64) and ``member`` (bool) per row; per table slot ``prefix`` ``[slots, >= entries
* width]`` int32 (entry ``e``'s prefix right-aligned in columns ``e * width .. e * width + width - 1``),
``bans`` and ``need`` ``[slots, >= entries]`` int64 (the id entry ``e`` masks, its prefix's length;
padding entries' ``need`` is past every length); ``input_ids`` and ``local_pos`` per row, both or
neither (drafts, as ``TokenWindow._read``); ``floor`` per row (int64) or ``None`` (a scoped entry:
``scope.FloorScopeTables``, the first position of the row's stretch, from the prompt's start).
Row ``r`` (position ``p = pos[r]``, engine slot ``min(slot_of_row[r], engine_slots - 1)``, output
length ``L = p - prompt_len + 1``, with a floor ``min(L, p - floor[r] + 1)``: a prefix must lie in
the stretch, and a row whose floor is past ``p + 1`` masks nothing) masks entry
``e``'s ban where ``member[r]``, ``need <= L``, the ban lies in ``[0, V)`` and, for every ``j <
need``, the prefix's ``j``-th cell from the right equals the token at ``p - j`` (the draft fed ``j``
rows before where ``j <= local_pos[r]``, else the matrix's). Every ban is ``-inf`` (a NaN logit
too: as the hosted path's ``index_fill_``; the eager device path's ``amin`` keeps a NaN). Nothing
here imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .variants import launch_variant

__all__ = ["BLOCK_E", "Case", "GATE", "NEVER", "OUT_OF_PHASE", "ban_reference", "banned_phrases_ban_", "block_width", "kernels", "launch", "launch_args", "probe_case", "variant"]

#: ``need`` of a padding entry: past every output length
NEVER = 1 << 40
#: entries per program (a power of two)
BLOCK_E = 32
#: the floor of a row out of its scoped entry's phase (``processors.device_thinking.NEVER``, not
#: imported: this module imports nothing from the processors)
OUT_OF_PHASE = 1 << 62


def block_width(width: int) -> int:
    """The token columns a program compares at a time for tables ``width`` wide (two variants)."""
    return 8 if width <= 8 else 32


@functools.cache
def kernels() -> Any:
    """The jitted kernels' module (Triton imported here, once)."""
    from . import _banned_phrases_triton

    return _banned_phrases_triton


def ban_reference(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                  slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
                  need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                  floor: torch.Tensor | None, entries: int, width: int) -> None:
    """The op's bans in torch ops (the module doc's rule as written), on host tensors: reads the
    hits' positions (``nonzero``), so it is the CPU implementation, not a device path."""
    rows = pos.shape[0]
    if rows == 0 or entries == 0 or width == 0:
        return
    device = pos.device
    engine = slot_of_row.clamp(max=tokens.shape[0] - 1)
    length = pos.long() - prompt_len[engine].long() + 1
    if floor is not None:
        length = torch.minimum(length, pos.long() - floor.long() + 1)
    back = torch.arange(width, device=device)
    token = tokens[engine[:, None], (pos.long()[:, None] - back).clamp(0, tokens.shape[1] - 1)].long()
    if input_ids is not None and local_pos is not None:
        fed = back[None, :] <= local_pos.long()[:, None]
        source = (torch.arange(rows, device=device)[:, None] - back).clamp(min=0)
        token = torch.where(fed, input_ids[source].long(), token)
    cells = prefix[slot_of_row, : entries * width].reshape(rows, entries, width).flip(2).long()
    needed = need[slot_of_row, :entries]
    used = back < needed[:, :, None]
    ids = bans[slot_of_row, :entries].long()
    hit = ((cells == token[:, None, :]) | ~used).all(2) & (needed <= length[:, None]) & member[:, None]
    hit &= (ids >= 0) & (ids < logits.shape[1])
    row, entry = hit.nonzero(as_tuple=True)
    logits.index_put_((row, ids[row, entry]), torch.full((), float("-inf"), dtype=logits.dtype, device=device))


@fused_op("banned_phrases_ban_", launches=1, mutates_args=("logits",))
def banned_phrases_ban_(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                        slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
                        need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                        floor: torch.Tensor | None, entries: int, width: int) -> None:
    """``-inf`` in ``logits`` at every ban of a matching entry (module doc). CPU implementation
    (every device but CUDA): ``ban_reference``; CUDA: one Triton launch (``launch``)."""
    ban_reference(logits, tokens, prompt_len, pos, slot_of_row, member, prefix, bans, need, input_ids, local_pos,
                  floor, entries, width)


@banned_phrases_ban_.cuda
def _ban_cuda(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
              slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
              need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
              floor: torch.Tensor | None, entries: int, width: int) -> None:
    launch(logits, tokens, prompt_len, pos, slot_of_row, member, prefix, bans, need, input_ids, local_pos, floor,
           entries, width)


def launch(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
           slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
           need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
           floor: torch.Tensor | None, entries: int, width: int) -> None:
    """The Triton kernel over ``rows x ceil(entries / BLOCK_E)`` programs (host integers: no sync);
    none for zero rows or entries."""
    rows = pos.shape[0]
    if rows == 0 or entries == 0 or width == 0:
        return
    for table in (prefix, bans, need):
        assert table.stride(1) == 1, "tables: contiguous rows"
    args, constexprs = launch_args(logits, tokens, prompt_len, pos, slot_of_row, member, prefix, bans, need, input_ids,
                                   local_pos, floor, entries, width)
    kernels().ban_rows[(rows, (entries + BLOCK_E - 1) // BLOCK_E)](*args, **constexprs)


def launch_args(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
                need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                floor: torch.Tensor | None, entries: int, width: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``ban_rows``' positional arguments and constexprs for ``launch``'s arguments (the launch and
    its off-step compile, ``variant``, take the same)."""
    drafts = input_ids is not None and local_pos is not None
    args = (logits, logits.stride(0), logits.stride(1), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1],
            tokens.shape[0], prompt_len, pos, slot_of_row, member.view(torch.uint8), prefix, prefix.stride(0), bans,
            bans.stride(0), need, need.stride(0), input_ids if drafts else pos, local_pos if drafts else pos,
            pos if floor is None else floor, entries, width, logits.shape[1])
    return args, {"BLOCK_E": BLOCK_E, "BLOCK_W": block_width(width), "HAS_DRAFTS": drafts, "HAS_FLOOR": floor is not None}


class Case(NamedTuple):
    """One random step's arguments (``probe_case``), in the op's order."""

    logits: torch.Tensor
    tokens: torch.Tensor
    prompt_len: torch.Tensor
    pos: torch.Tensor
    slot_of_row: torch.Tensor
    member: torch.Tensor
    prefix: torch.Tensor
    bans: torch.Tensor
    need: torch.Tensor
    input_ids: torch.Tensor | None
    local_pos: torch.Tensor | None
    floor: torch.Tensor | None
    entries: int
    width: int

    def to(self, device: torch.device) -> Case:
        """The same case on ``device``."""
        moved: dict[str, Any] = {k: v.to(device) for k, v in self._asdict().items() if isinstance(v, torch.Tensor)}
        return self._replace(**moved)


def probe_case(seed: int, *, rows: int = 12, slots: int = 9, length: int = 40, vocab: int = 50, entries: int = 7,
               width: int = 5, drafts: int = 0, floors: bool = False) -> Case:
    """A random step on the CPU: an engine matrix of few ids (so prefixes match often) with
    placeholders (``-1``), prompts of 1 to ``length // 2`` tokens, rows at random positions (some
    in prefill), some not members, a sentinel table slot past the engine's; per table slot up to
    ``entries`` entries of prefixes 0 to ``width`` long (the rest padding), bans below ``vocab``
    with repeats; ``drafts`` drafts per row at most (``input_ids`` with placeholders); with ``floors``
    a floor per row, before, inside or past its output, some ``scope``'s ``NEVER`` (out of phase)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 3, (slots, length), generator=g, dtype=torch.int32)
    tokens[torch.rand(slots, length, generator=g) < 0.03] = -1
    prompt_len = torch.randint(1, max(2, length // 2), (slots,), generator=g, dtype=torch.int32)
    slot_of_row = torch.randint(0, slots + 1, (rows,), generator=g)  # slots: the sentinel (never a member)
    pos = torch.randint(0, length, (rows,), generator=g)
    member = (torch.rand(rows, generator=g) < 0.85) & (slot_of_row < slots)
    need = torch.randint(0, width + 1, (slots + 1, entries), generator=g)
    need[torch.rand(slots + 1, entries, generator=g) < 0.2] = NEVER
    prefix = torch.randint(0, 3, (slots + 1, entries, width), generator=g, dtype=torch.int32)
    prefix[torch.arange(width) < width - need[:, :, None]] = -1  # unused cells, left of each prefix
    bans = torch.randint(0, vocab, (slots + 1, entries), generator=g)
    bans[:, 1::3] = bans[:, :1]  # repeated bans in a row
    input_ids = local_pos = None
    if drafts:
        local_pos = torch.randint(0, drafts + 1, (rows,), generator=g)
        input_ids = torch.randint(-1, 3, (rows,), generator=g, dtype=torch.int32)
    floor = None
    if floors:
        floor = torch.randint(-2, length + 2, (rows,), generator=g)
        floor[torch.rand(rows, generator=g) < 0.15] = OUT_OF_PHASE
    logits = torch.randn(rows, vocab, generator=g)
    return Case(logits, tokens, prompt_len, pos, slot_of_row, member, prefix.view(slots + 1, -1).contiguous(), bans,
                need, input_ids, local_pos, floor, entries, width)


def _probe(device: torch.device) -> bool:
    """``launch`` on ``device`` against ``ban_reference`` on the host, exactly (``GATE``)."""
    same = []
    for seed, drafts, width in ((1, 0, 5), (2, 2, 3), (3, 0, 12), (4, 3, 1), (5, 0, 40), (6, 0, 5), (7, 2, 12)):
        case = probe_case(20261128 + seed, drafts=drafts, width=width, floors=seed > 5)
        fused = case.to(device)
        launch(*fused)
        host = case.logits.clone()
        ban_reference(host, *case[1:])
        same.append(torch.equal(fused.logits.cpu(), host))
    return all(same)


#: the probe-at-first-use gate (``_probe`` looked up at call time)
GATE = FusedGate("banned_phrases", lambda device: _probe(device))


def variant(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
            slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
            need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
            floor: torch.Tensor | None, entries: int, width: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``launch`` for these arguments."""
    args, constexprs = launch_args(logits, tokens, prompt_len, pos, slot_of_row, member, prefix, bans, need,
                                           input_ids, local_pos, floor, entries, width)
    return launch_variant("banned_phrases", lambda: kernels().ban_rows, logits.device, args, constexprs)
