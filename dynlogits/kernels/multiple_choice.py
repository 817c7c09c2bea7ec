"""``multiple_choice``' Model Runner V2 step as one fused op (``dynlogits::multiple_choice_keep_``):
every member row's first tokens (from its ``base``) read from the engine's token matrix, compared
with every entry of its slot, and the row kept at the ids of the entries it matches, every other
logit ``-inf``: what ``processors.multiple_choice.MultipleChoiceGroup``'s eager device path
(``decide_from_window``, then ``apply_device_decisions``) writes, with each row's prompt length
replaced by ``base``, in one launch on CUDA (a Triton kernel, ``_multiple_choice_triton``: a
program per row and ``CHUNK`` columns, each deciding the entries whose ids its columns hold).

Arguments (the group's tables and the step's ``TokenWindow``): ``logits`` ``[rows, V]`` (any float
dtype, last dim contiguous); ``tokens`` ``[engine_slots, max_len]`` (any integer dtype); per row
``base`` (any integer dtype, read as int64: the position of the row's history's first token, the
prompt's length or a scoped entry's stretch start; ``>= OUT_OF_PHASE``: out of its phase), ``pos``
(int64: the row's last position), ``slot_of_row`` (int64, a table slot; the engine slot is
``min(slot_of_row, engine_slots - 1)``, as ``TokenWindow.slots``) and ``member`` (bool); per
table slot ``prefix`` ``[slots, >= entries * width]`` int32 (entry ``e``'s prefix left-aligned in
columns ``e * width .. e * width + width - 1``, unused cells ``-1``), ``depth`` ``[slots, >= entries]`` int64 (the prefix's length; padding entries
``NEVER``), ``at_least`` (bool) and ``ids`` (int64, each in ``[0, V)``) ``[slots, >= entries]``;
``input_ids`` (any integer dtype) and ``local_pos`` (int64) per row, both or neither: under
speculative decoding a row ``r`` with ``local_pos[r] = k`` drafts before it was fed, at rows ``r - k
.. r``, the last committed token then its drafts (``TokenWindow``).

A row ``r`` acts where ``member[r]`` and ``base[r] < OUT_OF_PHASE``; with ``n = max(pos - base + 1,
0)`` (the tokens of its history before it), entry ``e`` matches iff every used cell ``c`` (``>= 0``)
equals the token at position ``q`` (a ``-1`` placeholder never equals one) and ``depth == n`` or
(``at_least`` and ``depth <= n``). Without drafts ``q = base + c`` and the token is ``tokens[slot,
min(max(q, 0), max_len - 1)]``; with drafts, as ``TokenWindow.head``, ``q = min(base + c, pos)``,
``back = pos - q`` positions before the row's own, and the token is ``input_ids[max(r - back, 0)]``
where ``back <= local_pos[r]`` (the last committed token or a draft), else the matrix's as above.
(A used cell lies left of ``depth``, so a matching entry's cells all sit at ``q <= pos``: the two
readings decide alike on the group's tables.) An acting row keeps exactly its logits at the
ids of the entries it matches (the values unchanged, NaN included; an id two entries name is kept if
either matches) and every other logit becomes ``-inf`` (a row that matches none: all ``-inf``); the
other rows are unchanged. Nothing here imports Triton until a CUDA tensor arrives; no sync."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch

from dynlogits.kernels.fused import fused_op
from dynlogits.kernels.probe import FusedGate

from .variants import launch_variant, meta_scratch

__all__ = ["BLOCK_E", "BLOCK_V", "CHUNK", "Case", "GATE", "NEVER", "NUM_WARPS", "OUT_OF_PHASE", "block_width", "keep_reference", "kernels", "launch", "launch_args", "multiple_choice_keep_", "probe", "probe_case", "same_bits", "variant"]

#: ``depth`` of a padding entry: past every history's length (``MultipleChoiceGroup.NEVER``)
NEVER = 1 << 40
#: the base of a row out of its scoped entry's phase (``processors.modes.OUT_OF_PHASE``, not
#: imported: this module imports nothing from the processors)
OUT_OF_PHASE = 1 << 62
#: entries a program compares at a time (a power of two)
BLOCK_E = 64
#: logits a program fills at a time (a power of two)
BLOCK_V = 2048
#: the columns of a row one program keeps (a row of V logits: ``ceil(V / CHUNK)`` programs, so a
#: batch of one still spreads its fill over several multiprocessors)
CHUNK = 16384
#: warps per program (the fill's stores spread over them)
NUM_WARPS = 8


def block_width(width: int) -> int:
    """The token columns a program compares at a time for tables ``width`` wide (two variants)."""
    return 8 if width <= 8 else 32


@functools.cache
def kernels() -> Any:
    """The jitted kernel's module (Triton imported here, once)."""
    from . import _multiple_choice_triton

    return _multiple_choice_triton


_NEG_INF: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _neg_inf(logits: torch.Tensor) -> torch.Tensor:
    """A kept 0-dim ``-inf`` of ``logits``' dtype on its device (made once: a fill, no copy)."""
    key = (logits.dtype, logits.device)
    made = _NEG_INF.get(key)
    if made is None:
        made = _NEG_INF[key] = torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device)
    return made


def keep_reference(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
                   slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
                   at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None,
                   local_pos: torch.Tensor | None, entries: int, width: int) -> None:
    """The op in eager tensor ops (any device, no sync): ``MultipleChoiceGroup``'s cell-by-cell
    decision and its keep (``apply_device_decisions``) with ``prompt_len`` replaced by ``base`` and a
    row out of its phase no member: the tables gathered per row, the rows' first ``width`` tokens
    compared (with drafts: read as ``TokenWindow.head`` reads them), the entries' logits read
    (``-inf`` where not matched), the acting rows filled and the read ones written back
    (``scatter_reduce_`` ``amax``: a row that does not act gets its own values back, unchanged)."""
    rows = pos.shape[0]
    if rows == 0:
        return
    start = base.long()
    acting = member & (start < OUT_OF_PHASE)
    engine = slot_of_row.clamp(max=tokens.shape[0] - 1)
    at = start[:, None] + torch.arange(width, device=pos.device)
    drafts = input_ids is not None and local_pos is not None
    if drafts:
        at = torch.minimum(at, pos.long()[:, None])
    head = tokens[engine[:, None], at.clamp(0, tokens.shape[1] - 1)].long()  # [rows, width]
    if drafts:
        assert input_ids is not None and local_pos is not None
        back = pos.long()[:, None] - at  # how many positions before the row's own
        fed = back <= local_pos.long()[:, None]  # the last committed token or a draft, fed back rows before
        source = (torch.arange(rows, device=pos.device)[:, None] - back).clamp(min=0)
        head = torch.where(fed, input_ids[source].long(), head)
    cells = prefix[slot_of_row, : entries * width].view(rows, entries, width).long()
    n = (pos.long() - start + 1).clamp(min=0)[:, None]
    needed, at_least_rows = depth[slot_of_row, :entries], at_least[slot_of_row, :entries]
    same = ((cells == head[:, None, :]) | (cells < 0)).all(2)
    hit = same & ((needed == n) | (at_least_rows & (needed <= n)))
    index = ids[slot_of_row, :entries]
    kept = torch.where(hit, logits.gather(1, index), _neg_inf(logits))
    logits.masked_fill_(acting[:, None], float("-inf"))
    logits.scatter_reduce_(1, index, kept, reduce="amax")


@fused_op("multiple_choice_keep_", launches=1, mutates_args=("logits",))
def multiple_choice_keep_(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
                          slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
                          at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None,
                          local_pos: torch.Tensor | None, entries: int, width: int) -> None:
    """Each acting row kept at the ids of the entries it matches, the rest ``-inf`` (module doc).
    CPU implementation (every device but CUDA): ``keep_reference``; CUDA: one Triton launch
    (``launch``)."""
    keep_reference(logits, tokens, base, pos, slot_of_row, member, prefix, depth, at_least, ids, input_ids, local_pos,
                   entries, width)


@multiple_choice_keep_.cuda
def _keep_cuda(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
               slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
               at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
               entries: int, width: int) -> None:
    launch(logits, tokens, base, pos, slot_of_row, member, prefix, depth, at_least, ids, input_ids, local_pos, entries,
           width)


def launch(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
           slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
           at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
           entries: int, width: int, *, chunk: int = CHUNK) -> None:
    """The Triton kernel over ``rows x ceil(V / chunk)`` programs, each keeping ``chunk`` columns of
    a row (any device Triton runs on, its interpreter included; host integers only: no sync; with
    drafts its variant reading ``input_ids``), its scratch (each matched entry's saved logit and id) two ``torch.empty`` (no launch); none for
    zero rows or columns."""
    rows, vocab = pos.shape[0], logits.shape[1]
    if rows == 0 or vocab == 0:
        return
    assert logits.stride(1) == 1, "logits: a contiguous last dim"
    for table in (prefix, depth, at_least, ids):
        assert table.stride(1) == 1, "tables: contiguous rows"
    saved = torch.empty((rows, max(entries, 1)), dtype=logits.dtype, device=logits.device)
    at = torch.empty((rows, max(entries, 1)), dtype=torch.int32, device=logits.device)
    args, constexprs = launch_args(logits, tokens, base, pos, slot_of_row, member, prefix, depth, at_least, ids,
                                   input_ids, local_pos, entries, width, saved, at, chunk=chunk)
    kernels().keep_rows[(rows, (vocab + chunk - 1) // chunk)](*args, **constexprs)


def launch_args(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
                slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
                at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None,
                local_pos: torch.Tensor | None, entries: int, width: int, saved: torch.Tensor, at: torch.Tensor, *,
                chunk: int = CHUNK) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``keep_rows``' positional arguments and constexprs (``num_warps`` with them) for ``launch``'s
    arguments and its scratch ``saved`` and ``at`` (the launch and its off-step compile,
    ``variant``, take the same)."""
    drafts = input_ids is not None and local_pos is not None
    vocab = logits.shape[1]
    args = (logits, logits.stride(0), tokens, tokens.stride(0), tokens.stride(1), tokens.shape[1], tokens.shape[0], base,
            pos, slot_of_row, member.view(torch.uint8), prefix, prefix.stride(0), depth, depth.stride(0),
            at_least.view(torch.uint8), at_least.stride(0), ids, ids.stride(0), input_ids if drafts else pos,
            local_pos if drafts else pos, saved, at, entries, width, vocab)
    return args, {"BLOCK_E": BLOCK_E, "BLOCK_W": block_width(width), "BLOCK_V": BLOCK_V, "CHUNK": chunk,
                  "HAS_DRAFTS": drafts, "num_warps": NUM_WARPS}


class Case(NamedTuple):
    """One random step's arguments (``probe_case``), in the op's order."""

    logits: torch.Tensor
    tokens: torch.Tensor
    base: torch.Tensor
    pos: torch.Tensor
    slot_of_row: torch.Tensor
    member: torch.Tensor
    prefix: torch.Tensor
    depth: torch.Tensor
    at_least: torch.Tensor
    ids: torch.Tensor
    input_ids: torch.Tensor | None
    local_pos: torch.Tensor | None
    entries: int
    width: int

    def to(self, device: torch.device) -> Case:
        """The same case on ``device``."""
        moved: dict[str, Any] = {k: v.to(device) for k, v in self._asdict().items() if isinstance(v, torch.Tensor)}
        return self._replace(**moved)


def probe_case(seed: int, *, rows: int = 12, slots: int = 9, length: int = 24, vocab: int = 50, entries: int = 7,
               width: int = 5, dtype: torch.dtype = torch.float32, tokens_dtype: torch.dtype = torch.int32,
               drafts: int = 0) -> Case:
    """A random step on the CPU: an engine matrix of few ids (so prefixes match often) with
    placeholders (``-1``); per row a base from 0 to past the matrix's width (its columns clamped),
    some ``OUT_OF_PHASE``, and a position before it (a prefill chunk's row: ``n = 0``) or up to
    ``width + 1`` after it; some rows not members, a table slot past the engine's (members there read its last slot); per table
    slot ``entries`` entries (prefixes of 0 to ``width`` tokens left-aligned, some copied from a
    row's own head so they match, some ``at_least``, some padding), ids below ``vocab`` with
    repeats; logits with NaN, ``inf`` and ``-inf``; with ``drafts``, 0 to ``drafts`` drafts before
    each row (``local_pos``) and ``input_ids`` of the same few ids with placeholders (``-1``)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 3, (slots, length), generator=g)
    tokens[torch.rand(slots, length, generator=g) < 0.03] = -1
    slot_of_row = torch.randint(0, slots + 1, (rows,), generator=g)  # slots: past the engine's
    base = torch.randint(0, length + 3, (rows,), generator=g)
    base[torch.rand(rows, generator=g) < 0.15] = OUT_OF_PHASE
    pos = (base.clamp(max=length) - 1 + torch.randint(-2, width + 2, (rows,), generator=g)).clamp(min=0)
    member = torch.rand(rows, generator=g) < 0.85  # the table's last slot too (its engine slot: the last)
    depth = torch.randint(0, width + 1, (slots + 1, entries), generator=g)
    prefix = torch.randint(0, 3, (slots + 1, entries, width), generator=g)
    engine = slot_of_row.clamp(max=slots - 1)
    input_ids = local_pos = None
    if drafts:
        local_pos = torch.randint(0, drafts + 1, (rows,), generator=g)
        input_ids = torch.randint(-1, 3, (rows,), generator=g)
    for r in range(rows):  # some of the row's slot's entries follow the row's own history
        if entries and int(base[r]) < OUT_OF_PHASE and bool(torch.rand(1, generator=g) < 0.6):
            e = int(torch.randint(0, entries, (1,), generator=g))
            at = base[r] + torch.arange(width)
            if input_ids is not None and local_pos is not None:
                at = at.clamp(max=int(pos[r]))
            head = tokens[engine[r], at.clamp(0, length - 1)]
            if input_ids is not None and local_pos is not None:  # the drafts fed before the row
                back = pos[r] - at
                head = torch.where(back <= local_pos[r], input_ids[(r - back).clamp(min=0)], head)
            prefix[slot_of_row[r], e] = head.clamp(min=0)
            depth[slot_of_row[r], e] = min(width, max(0, int(pos[r] - base[r] + 1)))
    padding = torch.rand(slots + 1, entries, generator=g) < 0.15
    depth[padding] = NEVER
    prefix[torch.arange(width) >= depth[:, :, None]] = -1  # unused cells, right of each prefix
    at_least = torch.rand(slots + 1, entries, generator=g) < 0.3
    ids = torch.randint(0, vocab, (slots + 1, entries), generator=g)
    ids[:, 1::3] = ids[:, :1]  # repeated ids in a row
    logits = torch.randn(rows, vocab, generator=g)
    odd = torch.rand(rows, vocab, generator=g)
    logits[odd < 0.04] = float("nan")
    logits[(odd >= 0.04) & (odd < 0.06)] = float("inf")
    logits[(odd >= 0.06) & (odd < 0.08)] = float("-inf")
    return Case(logits.to(dtype), tokens.to(tokens_dtype), base, pos, slot_of_row, member,
                prefix.to(torch.int32).view(slots + 1, -1).contiguous(), depth, at_least, ids,
                None if input_ids is None else input_ids.to(tokens_dtype), local_pos, entries, width)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float tensors are equal bit for bit (on the host), NaNs at the same places (a
    NaN's payload aside: the CPU's float16 ``scatter_reduce_`` ``amax`` rewrites it)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0).view(bits), b.masked_fill(nan, 0).view(bits))


def probe(device: torch.device) -> bool:
    """``launch`` on ``device`` against ``keep_reference`` on the host, bit for bit (``GATE``):
    float32, bfloat16 and float16, int32 and int64 tokens, one and several column blocks, rows of
    one and of several chunks, without drafts and with (both kernel variants)."""
    same = []
    for seed, width, dtype, tokens_dtype, drafts in (
            (1, 5, torch.float32, torch.int32, 0), (2, 3, torch.bfloat16, torch.int64, 2),
            (3, 12, torch.float32, torch.int64, 0), (4, 1, torch.float16, torch.int32, 3),
            (5, 40, torch.bfloat16, torch.int32, 0), (6, 12, torch.float32, torch.int32, 2)):
        case = probe_case(20261128 + seed, width=width, entries=3 + 31 * (seed % 3), dtype=dtype,
                          tokens_dtype=tokens_dtype, drafts=drafts)
        fused = case.to(device)
        launch(*fused, chunk=CHUNK if seed % 2 else 16)
        host = case.logits.clone()
        keep_reference(host, *case[1:])
        same.append(same_bits(fused.logits, host))
    return all(same)


#: the probe-at-first-use gate (``probe`` looked up at call time)
GATE = FusedGate("multiple_choice", lambda device: probe(device))


def variant(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
            slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
            at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None,
            local_pos: torch.Tensor | None, entries: int, width: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``launch`` for these arguments (its
    scratch as kept meta tensors: only their dtypes are read, no stride of theirs is passed)."""
    args, constexprs = launch_args(logits, tokens, base, pos, slot_of_row, member, prefix, depth, at_least,
                                           ids, input_ids, local_pos, entries, width, meta_scratch(logits.dtype),
                                           meta_scratch(torch.int32))
    return launch_variant("multiple_choice", lambda: kernels().keep_rows, logits.device, args, constexprs)
