"""Each kind's ``(variant, compile)`` pair (``dynlogits.kernels.variants.launch_variant``) for its
fused op's launch: the arguments and constexprs its kernel module's ``launch_args`` gives the launch
itself, so the compile warms exactly what the launch will look up."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .variants import launch_variant, launches_variant

__all__ = ["banned_phrases", "dead_rows", "dry", "forced_pick_settle", "forced_settle", "multiple_choice", "no_repeat_ngram",
           "spans", "thinking_force"]


def no_repeat_ngram(logits: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, slot_of_row: torch.Tensor,
                    params: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                    floor: torch.Tensor | None, width: int, size: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.no_repeat_ngram.ban_``'s launch for these arguments."""
    from . import no_repeat_ngram as kernels

    args, constexprs = kernels.launch_args(logits, tokens, pos, slot_of_row, params, input_ids, local_pos, floor,
                                           width, size)
    return launch_variant("no_repeat_ngram", _ban_rows(kernels), logits.device, args, constexprs)


def banned_phrases(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
                   slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, bans: torch.Tensor,
                   need: torch.Tensor, input_ids: torch.Tensor | None, local_pos: torch.Tensor | None,
                   floor: torch.Tensor | None, entries: int, width: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.banned_phrases.launch`` for these arguments."""
    from . import banned_phrases as kernels

    args, constexprs = kernels.launch_args(logits, tokens, prompt_len, pos, slot_of_row, member, prefix, bans, need,
                                           input_ids, local_pos, floor, entries, width)
    return launch_variant("banned_phrases", _ban_rows(kernels), logits.device, args, constexprs)


def dry(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: torch.Tensor, pos: torch.Tensor,
        input_ids: torch.Tensor | None, local_pos: torch.Tensor | None, slot_of_row: torch.Tensor, member: torch.Tensor,
        params: torch.Tensor, singles: torch.Tensor, amounts: torch.Tensor, width: int, cap: int,
        floor: torch.Tensor | None) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.dry.decide``'s launch for these arguments (its two
    outputs as meta tensors of their shapes: only their dtypes and strides are read)."""
    from . import dry as kernels

    rows = max(pos.shape[0], 1)
    ids = torch.empty(rows, max(width - 1, 1), dtype=torch.int64, device="meta")
    lowered = torch.empty(rows, max(width - 1, 1), dtype=logits.dtype, device="meta")
    args, constexprs = kernels.launch_args(logits, tokens, prompt_len, pos, input_ids, local_pos, slot_of_row, member,
                                           params, singles, amounts, width, cap, floor, ids, lowered)
    return launch_variant("dry", lambda: kernels.kernels().decide_rows, logits.device, args, constexprs)


def multiple_choice(logits: torch.Tensor, tokens: torch.Tensor, base: torch.Tensor, pos: torch.Tensor,
                    slot_of_row: torch.Tensor, member: torch.Tensor, prefix: torch.Tensor, depth: torch.Tensor,
                    at_least: torch.Tensor, ids: torch.Tensor, input_ids: torch.Tensor | None,
                    local_pos: torch.Tensor | None, entries: int, width: int) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.multiple_choice.launch`` for these arguments (its
    scratch as kept meta tensors: only their dtypes are read, no stride of theirs is passed)."""
    from . import multiple_choice as kernels

    args, constexprs = kernels.launch_args(logits, tokens, base, pos, slot_of_row, member, prefix, depth, at_least,
                                           ids, input_ids, local_pos, entries, width, _meta(logits.dtype),
                                           _meta(torch.int32))
    return launch_variant("multiple_choice", lambda: kernels.kernels().keep_rows, logits.device, args, constexprs)


def forced_settle(logits: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor, if_dead: torch.Tensor,
                  can_stop: torch.Tensor | None, chosen: torch.Tensor,
                  dead: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of ``dynlogits.kernels.forced.settle_``'s two launches (``decide_rows``,
    ``fill_rows``) for these arguments."""
    from . import forced as kernels

    decide = kernels.decide_args(logits, rows, picked, if_dead, can_stop, chosen, dead)
    fill = kernels.fill_args(logits, rows, chosen, dead, can_stop)
    return launches_variant([
        launch_variant("forced.decide_rows", lambda: kernels.kernels().decide_rows, logits.device, *decide),
        launch_variant("forced.fill_rows", lambda: kernels.kernels().fill_rows, logits.device, *fill)])


def forced_pick_settle(logits: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                       values: torch.Tensor, identity: bool, can_stop: torch.Tensor | None, pick: torch.Tensor,
                       chosen: torch.Tensor, dead: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of ``dynlogits.kernels.forced.pick_settle_``'s two launches
    (``pick_decide_rows``, ``fill_rows``) for these arguments."""
    from . import forced as kernels

    decide = kernels.pick_decide_args(logits, rows, table, bounds, values, identity, can_stop, pick, chosen, dead)
    fill = kernels.fill_args(logits, rows, chosen, dead, can_stop)
    return launches_variant([
        launch_variant("forced.pick_decide_rows", lambda: kernels.kernels().pick_decide_rows, logits.device, *decide),
        launch_variant("forced.fill_rows", lambda: kernels.kernels().fill_rows, logits.device, *fill)])


def thinking_force(logits: torch.Tensor, decisions: torch.Tensor, member: torch.Tensor, slot_of_row: torch.Tensor,
                   stops: torch.Tensor, positions: torch.Tensor, sentinel: int, flags: torch.Tensor, dead: torch.Tensor,
                   real: torch.Tensor, sequence: torch.Tensor, length: torch.Tensor,
                   scoped: bool) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.thinking_force.launch`` for these arguments."""
    from . import thinking_force as kernels

    args, constexprs = kernels.launch_args(logits, decisions, member, slot_of_row, stops, positions, sentinel, flags,
                                           dead, real, sequence, length, scoped)
    return launch_variant("thinking_force", lambda: kernels.kernels().settle_rows, logits.device, args, constexprs)


def dead_rows(logits: torch.Tensor, witness: torch.Tensor, rows: torch.Tensor | None, slots: torch.Tensor,
              positions: torch.Tensor | None, stop_index: torch.Tensor | None, can_stop: torch.Tensor | None,
              stops: torch.Tensor | None, where: torch.Tensor | None, real_rows: torch.Tensor | None,
              flags: torch.Tensor) -> tuple[Hashable, Callable[[], object]]:
    """``launch_variant`` of ``dynlogits.kernels.dead_rows.launch`` for these arguments."""
    from . import dead_rows as kernels

    args, constexprs = kernels.launch_args(logits, witness, rows, slots, positions, stop_index, can_stop, stops, where,
                                           real_rows, flags)
    return launch_variant("dead_rows", lambda: kernels.kernels().dead_rows, logits.device, args, constexprs)


def spans(advances: Sequence[tuple[Any, ...]] = (),
          drafts: Sequence[tuple[Any, ...]] = ()) -> tuple[Hashable, Callable[[], object]]:
    """``launches_variant`` of the span ops one gated call makes: ``spans_advance_`` with each of
    ``advances`` (its arguments; one that launches nothing left out) then ``spans_drafts_`` with each
    of ``drafts``, each launch's kernel and arguments from ``dynlogits.kernels.spans.launch_args`` and
    ``drafts_args`` (as the launches take them)."""
    from . import spans as kernels

    pairs = []
    for args in advances:
        state, rounds, rule, restart = args[0], args[6], args[10], args[11] if len(args) > 11 else None
        if kernels.launches(state.shape[0], rounds, rule, restart):
            name, launched, constexprs = kernels.launch_args(*args)
            pairs.append(launch_variant(f"spans.{name}", _jitted(kernels, name), state.device, launched, constexprs))
    for args in drafts:
        if args[6].shape[0]:  # the rows' slots: none, no launch
            name, launched, constexprs = kernels.drafts_args(*args)
            pairs.append(launch_variant(f"spans.{name}", _jitted(kernels, name), args[0].device, launched, constexprs))
    return launches_variant(pairs)


def _jitted(module: Any, name: str) -> Callable[[], Any]:
    """The module's jitted kernel ``name``, looked up at the call (Triton imported then)."""
    return lambda: getattr(module.kernels(), name)


_META: dict[torch.dtype, torch.Tensor] = {}


def _meta(dtype: torch.dtype) -> torch.Tensor:
    """A kept ``[1, 1]`` meta tensor of ``dtype`` (a scratch argument whose dtype alone is keyed)."""
    made = _META.get(dtype)
    if made is None:
        made = _META[dtype] = torch.empty((1, 1), dtype=dtype, device="meta")
    return made


def _ban_rows(module: Any) -> Callable[[], Any]:
    """The module's jitted ``ban_rows``, looked up at the call (Triton imported then)."""
    return lambda: module.kernels().ban_rows
